"""`chainrun report`: a chain's timeline (PNG, HTML) and summary, built on chain.summary."""

from chainrun.report.timeline import Bar, Span, Timeline, Wait, build_timeline, summarize

__all__ = ["Bar", "Span", "Timeline", "Wait", "build_timeline", "summarize"]
