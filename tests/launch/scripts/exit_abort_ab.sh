#!/bin/bash
# Aborts at exit with and without shoal's exit hook (shoal.launch.exit_hook), N pairs (default 40):
# a two-rank gloo DDP script that never leaves its process group, launched with the hook, then with
# SHOAL_EXIT_HOOK=0. Prints how many launches ended in SIGABRT (exit 134) each way.
# Usage: exit_abort_ab.sh [PAIRS] [run|mpirun]   run: shoal run --nproc 2 (default);
#        mpirun: shoal launch --hosts localhost:2 --via mpirun (each rank under rank_status)
cd "$(dirname "$0")/../../.."
pairs=${1:-40}
case ${2:-run} in
  run) launch=(.venv/bin/python -m shoal run --nproc 2) ;;
  mpirun) launch=(.venv/bin/python -m shoal launch --hosts localhost:2 --via mpirun --) ;;
  *) echo "usage: $0 [PAIRS] [run|mpirun]" >&2; exit 2 ;;
esac
dir=$(mktemp -d)
cat > "$dir/ddp_no_destroy.py" <<'PY'
import torch, torch.distributed as dist
from torch import nn
dist.init_process_group("gloo")
model = nn.parallel.DistributedDataParallel(nn.Linear(64, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(20):
    opt.zero_grad()
    model(torch.randn(32, 64)).sum().backward()
    opt.step()
PY
with=0; without=0
for i in $(seq 1 "$pairs"); do
  "${launch[@]}" "$dir/ddp_no_destroy.py" > /dev/null 2>&1; [ $? -eq 134 ] && with=$((with + 1))
  SHOAL_EXIT_HOOK=0 "${launch[@]}" "$dir/ddp_no_destroy.py" > /dev/null 2>&1; [ $? -eq 134 ] && without=$((without + 1))
done
rm -rf "$dir"
echo "launch=${2:-run} pairs=$pairs aborts_with_hook=$with aborts_without=$without"
