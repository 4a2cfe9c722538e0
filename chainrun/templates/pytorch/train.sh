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
HERE=$(dirname "$(readlink -f "$0")")
exec "${PYTHON:-python3}" "$HERE/train.py"   # exec: the signal reaches python directly
