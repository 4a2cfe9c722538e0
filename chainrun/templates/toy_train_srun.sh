#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=1
#SBATCH --mem=100M
# A multi-node chainrun payload: one rank per node under srun. The wrapper sends CHAINRUN_SIGNAL to
# this script's process group; srun is in it and forwards the signal to every task on every node.
# --kill-on-bad-exit: a rank that dies (without a signal) ends the whole step, so the segment is a crash.
exec srun --kill-on-bad-exit=1 --label python3 "$(dirname "$(readlink -f "${CHAINRUN_TOY:-$0}")")/toy_trainer.py"
