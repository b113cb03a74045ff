#!/usr/bin/env bash
# The floor: the same packages and files gpuenv's site.yml installs for the sandbox stack, put in
# place by plain commands in sequence, with no orchestration, no checks beyond sha256sum, no
# records, no idempotence. What gpuenv costs is measured against this (bench/run).
#
# Runs as root on the host it provisions (bench/run copies it there). Its inputs are environment
# variables, which bench/run sets from the same stack gpuenv installs:
#   FLOOR_MIRROR          NVIDIA redist mirror base (http://10.199.0.1:8000)
#   FLOOR_CUDA            CUDA release of the redist manifest (12.4.1)
#   FLOOR_CUDA_COMPONENTS components to unpack (cuda_cudart cuda_nvcc cuda_nvrtc)
#   FLOOR_CUDNN           cuDNN version (9.1.0.70); its manifest is redistrib_<X.Y.Z>.json
#   FLOOR_PYTHON          Python of the environment (3.11)
#   FLOOR_REQUIREMENTS    pinned requirements, space-separated (torch==2.5.1 ...)
#   FLOOR_DRIVER_PACKAGES Debian's driver packages (nvidia-kernel-dkms nvidia-smi libcuda1)
#   FLOOR_KERNEL_HEADERS  1: headers for every installed kernel, for DKMS (the driver's full mode)
#   FLOOR_OVERLAP         1: the driver's apt install (and its DKMS build) runs in the background
#                         while the CUDA, cuDNN and environment stages run (the Python packages the
#                         environment needs are installed first: apt holds dpkg's lock throughout);
#                         what the best overlap of the stages could give (the overlap lever)
# Each stage prints "floor-stage NAME SECONDS" on its own line; bench/run reads them. With
# FLOOR_OVERLAP=1 the driver's line comes last and counts only the wait for it after the others.
set -euo pipefail

mirror=${FLOOR_MIRROR:?set FLOOR_MIRROR to the NVIDIA redist mirror}
cuda=${FLOOR_CUDA:?set FLOOR_CUDA, e.g. 12.4.1}
components=${FLOOR_CUDA_COMPONENTS:-cuda_cudart cuda_nvcc cuda_nvrtc}
cudnn=${FLOOR_CUDNN:?set FLOOR_CUDNN, e.g. 9.1.0.70}
python=${FLOOR_PYTHON:?set FLOOR_PYTHON, e.g. 3.11}
requirements=${FLOOR_REQUIREMENTS:?set FLOOR_REQUIREMENTS, e.g. torch==2.5.1}
driver_packages=${FLOOR_DRIVER_PACKAGES:-nvidia-kernel-dkms nvidia-smi libcuda1}
kernel_headers=${FLOOR_KERNEL_HEADERS:-1}
overlap=${FLOOR_OVERLAP:-0}

cuda_mm=${cuda%.*}
cuda_major=${cuda%%.*}
tree=/usr/local/cuda-$cuda_mm
work=/var/tmp/floor
export DEBIAN_FRONTEND=noninteractive TMPDIR=$work
mkdir -p "$work"
cd "$work"

stage_start=$SECONDS
stage() { echo "floor-stage $1 $((SECONDS - stage_start))"; stage_start=$SECONDS; }

# A value from a redist manifest, by a path of keys.
manifest() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))
for k in sys.argv[2:]: d=d[k]
print(d)' "$@"; }

# --- driver: Debian's packages, and headers for every installed kernel so that DKMS builds for each
apt-get update -qq
headers=()
if [ "$kernel_headers" = 1 ]; then
  for k in /lib/modules/*; do [ -d "$k" ] && headers+=("linux-headers-$(basename "$k")"); done
fi
if [ "$overlap" = 1 ]; then
  apt-get install -y -qq --no-install-recommends "python$python" "python$python-venv" >/dev/null
  # shellcheck disable=SC2086  # the package lists are word lists
  apt-get install -y -qq --no-install-recommends ${headers[@]+"${headers[@]}"} $driver_packages >"$work/driver.log" 2>&1 &
  driver_pid=$!
  stage python
else
  # shellcheck disable=SC2086  # the package lists are word lists
  apt-get install -y -qq --no-install-recommends ${headers[@]+"${headers[@]}"} $driver_packages >/dev/null
  stage driver
fi

# --- CUDA toolkit: NVIDIA's redist archives from the mirror, unpacked into one tree
curl -fsS -o cuda.json "$mirror/compute/cuda/redist/redistrib_$cuda.json"
mkdir -p "$tree"
for c in $components; do
  rel=$(manifest cuda.json "$c" linux-x86_64 relative_path)
  sum=$(manifest cuda.json "$c" linux-x86_64 sha256)
  curl -fsS -o "$(basename "$rel")" "$mirror/compute/cuda/redist/$rel"
  echo "$sum  $(basename "$rel")" | sha256sum -c --quiet
  tar -xJf "$(basename "$rel")" --strip-components=1 -C "$tree"
  rm -f "$(basename "$rel")"
done
[ -e "$tree/lib64" ] || ln -s lib "$tree/lib64"
ln -sfn "$tree" /usr/local/cuda
echo "$tree/lib64" >/etc/ld.so.conf.d/floor-cuda.conf
stage cuda

# --- cuDNN: the tarball's headers and libraries copied into the tree (NVIDIA's install guide)
cudnn_xyz=$(echo "$cudnn" | cut -d. -f1-3)
curl -fsS -o cudnn.json "$mirror/compute/cudnn/redist/redistrib_$cudnn_xyz.json"
rel=$(manifest cudnn.json cudnn linux-x86_64 "cuda$cuda_major" relative_path)
sum=$(manifest cudnn.json cudnn linux-x86_64 "cuda$cuda_major" sha256)
curl -fsS -o cudnn.tar.xz "$mirror/compute/cudnn/redist/$rel"
echo "$sum  cudnn.tar.xz" | sha256sum -c --quiet
mkdir -p cudnn && tar -xJf cudnn.tar.xz --strip-components=1 -C cudnn
cp -P cudnn/include/cudnn*.h "$tree/include/"
cp -P cudnn/lib/libcudnn* "$tree/lib64/"
chmod a+r "$tree"/include/cudnn*.h "$tree"/lib64/libcudnn*
ldconfig
stage cudnn

# --- the PyTorch environment: a venv and pip (the host's pip.conf names the index)
[ "$overlap" = 1 ] || apt-get install -y -qq --no-install-recommends "python$python" "python$python-venv" >/dev/null
"python$python" -m venv /opt/floor/env
# shellcheck disable=SC2086
/opt/floor/env/bin/pip install -q --disable-pip-version-check $requirements
stage env
if [ "$overlap" = 1 ]; then
  wait "$driver_pid" || { cat "$work/driver.log" >&2; echo "floor: the driver's install failed (above)" >&2; exit 1; }
  stage driver
fi

# --- the check a hand install ends with
/opt/floor/env/bin/python -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())'
ldconfig -p | grep -q 'libcudnn.so.9 ' || { echo "floor: libcudnn.so.9 not in the loader's cache" >&2; exit 1; }
stage verify
rm -rf "$work"
