#!/bin/bash
#SBATCH --cpus-per-task=1
#SBATCH --mem=1G
## on a GPU partition, e.g.:
## #SBATCH --gres=gpu:1
## #SBATCH --cpus-per-task=8
# chainrun runs this script once per segment:  chainrun submit train.sh --total 72h
# Set up the environment here: later segments are submitted by `chainrun watch`.
# source ~/venvs/hf/bin/activate
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}   # compute nodes often have no internet; drop if yours do
# Multi-node: `accelerate launch` runs torchrun underneath, which passes TERM on but not USR2:
# submit with --signal TERM@300 (docs/checkpoint-contract.md, "Multi-node payloads"):
#   exec srun --kill-on-bad-exit=1 accelerate launch --num_machines=$SLURM_NNODES \
#        --machine_rank=$SLURM_NODEID --main_process_ip=$(scontrol show hostnames | head -n1) "$HERE/train.py"
HERE=$(dirname "$(readlink -f "$0")")
exec "${PYTHON:-python3}" "$HERE/train.py"
