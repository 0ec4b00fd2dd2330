# Sourced by the .ci/gpu_* scripts. The device tool returns at most 8 files from $OUT, so
# every part's output goes into one log, $OUT/log.txt, appended as each part ends (a call
# cut at its limit still returns the parts done), and a one-line summary goes to stdout.
# `part NAME LIMIT CMD...` runs CMD under `timeout LIMIT` (CMD is a program, not a shell
# function: `part NAME LIMIT .ci/fresh CMD...` runs CMD with empty caches). At the limit
# CMD gets SIGINT, so pytest still prints its failures and Python where it stopped; a
# KILL follows 15 s later.
OUT="${OUT:-gpu-out}"
mkdir -p "$OUT"
_PARTS="$(mktemp -d)"
part() {
    local name=$1 limit=$2 t=$SECONDS rc
    shift 2
    timeout -s INT -k 15 "$limit" "$@" > "$_PARTS/$name.txt" 2>&1
    rc=$?
    echo "rc=$rc wall=$((SECONDS - t))s" >> "$_PARTS/$name.txt"
    { echo "===== $name"; cat "$_PARTS/$name.txt"; } >> "$OUT/log.txt"
    echo "part $name rc=$rc wall=$((SECONDS - t))s (at ${SECONDS}s)"
}
