#!/usr/bin/env bash
# Installs every Debian package ampipe needs on a fresh Debian 12 machine (run as root).
# Idempotent: packages already present are skipped; `apt-get update` runs at most once.
set -euo pipefail
PKGS=(
  build-essential g++ cmake ninja-build pkg-config git
  libdnnl-dev ocl-icd-opencl-dev          # oneDNN GEMM; its CMake config needs OpenCL
  openmpi-bin libopenmpi-dev              # communication
  libcli11-dev nlohmann-json3-dev libfmt-dev
  libxxhash-dev                           # XXH64, the checkpoints' checksums (core/checksum.h)
  libcairo2-dev fonts-dejavu-core         # the loss plot (train/loss_plot.h) and the font of its text
  libpcre2-dev libutf8proc-dev            # byte-level BPE tokenizers: patterns, normalization (train/bpe_tokenizer.h)
  libsentencepiece-dev                    # subword tokenizer (ampipe preprocess, --tokenizer-model)
  libgtest-dev libgmock-dev libbenchmark-dev
  iproute2                                # network namespaces + tbf for the overlap benchmarks
  python3 python3-numpy python3-matplotlib # independent numpy check, plots
  python3-pip                             # pip-installs the tokenizers test reference below
  python3-torch                           # the PyTorch loader, tools/torch_eval.py (its test: cli.torch_loader.*)
  slurmd slurmctld slurm-client munge     # SLURM launch (scripts/slurm/); its test starts a single-host SLURM
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup.sh: missing packages (${missing[*]}) and not root; rerun as root" >&2; exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "setup.sh: all ${#PKGS[@]} packages present"
# From PyPI, for a test reference only (never a build dependency): Hugging Face's tokenizers, against which
# train.bpe_tokenizers_match_hf_tokenizers checks the BPE tokenizers (a ~3 MB wheel). Without it that test skips.
if ! python3 -c 'import tokenizers' 2>/dev/null; then
  python3 -m pip install --quiet tokenizers 2>/dev/null ||
    python3 -m pip install --quiet --break-system-packages tokenizers 2>/dev/null ||
    echo "setup.sh: note: could not pip-install tokenizers; train.bpe_tokenizers_match_hf_tokenizers will skip" >&2
fi
