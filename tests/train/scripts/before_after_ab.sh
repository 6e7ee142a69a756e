#!/bin/bash
# CPU and wall time of one `shoal train digits --nproc N` (fork workers, one step per rank), this
# tree against another (BEFORE: its src/ directory, e.g. a `git worktree add /tmp/before REV`),
# alternating, PAIRS pairs. /usr/bin/time's user + sys include the workers (waited for).
# Usage: before_after_ab.sh BEFORE_SRC [NPROC] [PAIRS]
cd "$(dirname "$0")/../../.."
before=${1:?usage: $0 BEFORE_SRC [NPROC] [PAIRS]}; nproc=${2:-2}; pairs=${3:-6}
out=$(mktemp -d)
for i in $(seq 1 "$pairs"); do
  for side in before after; do
    path=$([ "$side" = before ] && echo "$before" || echo "$PWD/src")
    rm -rf "$out/run"
    PYTHONPATH=$path /usr/bin/time -f "$side nproc=$nproc %e s wall %U u %S s" -o "$out/time" \
      .venv/bin/python -m shoal train digits --nproc "$nproc" --epochs 1 --batch-size 1024 --device cpu \
      --no-progress --out "$out/run" > /dev/null 2>&1 || echo "$side: FAILED"
    cat "$out/time"
  done
done
rm -rf "$out"
