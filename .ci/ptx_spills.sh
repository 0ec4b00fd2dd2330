#!/bin/bash
# .ci/ptx_spills.sh DIR: per PTX file that `.ci/offline_compile.py --ptx DIR` wrote, the
# config, registers, spill bytes (ptxas -v for sm_90a) and SASS instruction count
# (cuobjdump), with the ptxas and cuobjdump bundled with Triton. No GPU needed.
B=$(dirname "$(${PYTHON:-python3} -c "import triton;print(triton.__file__)")")/backends/nvidia/bin
for f in $1/*.ptx; do
  cfg=$(head -1 $f | grep -oP "DROPOUT=\S+|BLOCK_M=\d+ BLOCK_N=\d+ w\d+s\d+|BLOCK_M=\d+ w\d+s\d+" | tr '\n' ' ')
  k=$(basename $f .ptx | sed 's/-[0-9]*$//')
  tail -n +2 $f > /tmp/k.ptx
  r=$($B/ptxas-blackwell -v --gpu-name=sm_90a /tmp/k.ptx -o /tmp/k.cubin 2>&1 | grep -oP "Used \d+ registers|\d+ bytes spill stores" | tr '\n' ' ')
  n=$($B/cuobjdump -sass /tmp/k.cubin 2>/dev/null | grep -cP "^\s+/\*[0-9a-f]{4,6}\*/")
  printf "%-28s %-40s SASS %6d  %s\n" $k "$cfg" $n "$r"
done
