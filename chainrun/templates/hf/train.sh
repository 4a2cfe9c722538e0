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
HERE=$(dirname "$(readlink -f "$0")")
exec "${PYTHON:-python3}" "$HERE/train.py"
