#!/bin/bash
#SBATCH --cpus-per-task=1
#SBATCH --mem=100M
# A chainrun payload: exec the trainer so the signal reaches it directly.
exec python3 "$(dirname "$(readlink -f "${CHAINRUN_TOY:-$0}")")/toy_trainer.py"
