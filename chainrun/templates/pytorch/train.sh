#!/bin/bash
#SBATCH --cpus-per-task=1
#SBATCH --mem=1G
## on a GPU partition, e.g.:
## #SBATCH --gres=gpu:1
## #SBATCH --cpus-per-task=8
# chainrun runs this script once per segment:  chainrun submit train.sh --total 72h
# Set up the environment here (not in the shell you submit from): later segments are
# submitted by `chainrun watch`.
# source ~/venvs/torch/bin/activate        # or: module load pytorch
# Multi-node (one process per GPU, ranks from SLURM_PROCID; srun passes any signal on):
#   #SBATCH --nodes=2 --ntasks-per-node=4 --gres=gpu:4
#   exec srun --kill-on-bad-exit=1 "${PYTHON:-python3}" "$HERE/train.py"
# With torchrun between srun and python, submit with --signal TERM@300: torchrun passes TERM on,
# not USR2 (docs/checkpoint-contract.md, "Multi-node payloads"):
#   exec srun --kill-on-bad-exit=1 torchrun --nnodes=$SLURM_NNODES --nproc_per_node=4 \
#        --rdzv_backend=c10d --rdzv_endpoint=$(hostname):29500 "$HERE/train.py"
HERE=$(dirname "$(readlink -f "$0")")
exec "${PYTHON:-python3}" "$HERE/train.py"   # exec: the signal reaches python directly
