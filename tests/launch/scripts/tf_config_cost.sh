#!/bin/bash
# What --tf-config costs a launch: `shoal run --nproc 2` of an empty script without and with it,
# alternating, N pairs (default 3). Prints each launch's wall time and CPU time (user + sys of the
# launcher and its workers, which /usr/bin/time counts as they are waited for).
# Usage: tf_config_cost.sh [PAIRS]
cd "$(dirname "$0")/../../.."
pairs=${1:-3}
dir=$(mktemp -d)
: > "$dir/empty.py"
for i in $(seq 1 "$pairs"); do
  for flag in "" --tf-config; do
    /usr/bin/time -f "${flag:-(none)} %e s wall, %U s user, %S s sys" -o "$dir/time" \
      .venv/bin/python -m shoal run --nproc 2 $flag "$dir/empty.py" > /dev/null 2>&1
    cat "$dir/time"
  done
done
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
rm -rf "$dir"
