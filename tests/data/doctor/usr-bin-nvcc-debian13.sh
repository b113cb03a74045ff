#!/bin/sh

export PATH="/usr/lib/nvidia-cuda-toolkit/bin:$PATH"
exec /usr/lib/nvidia-cuda-toolkit/bin/nvcc "$@"
