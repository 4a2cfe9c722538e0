#!/bin/bash
#SBATCH --cpus-per-task=1
#SBATCH --mem=1G
## on a GPU partition, e.g.:
## #SBATCH --gres=gpu:1
## #SBATCH --cpus-per-task=8
# chainrun runs this script once per segment:  chainrun submit train.sh --total 72h
# Set up the environment here: later segments are submitted by `chainrun watch`.
# source ~/venvs/lightning/bin/activate
# Multi-node: Lightning reads Slurm's environment (Trainer(num_nodes=2, devices=4)):
#   #SBATCH --nodes=2 --ntasks-per-node=4 --gres=gpu:4
#   exec srun --kill-on-bad-exit=1 "${PYTHON:-python3}" "$HERE/train.py"
HERE=$(dirname "$(readlink -f "$0")")
exec "${PYTHON:-python3}" "$HERE/train.py"
