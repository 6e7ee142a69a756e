#!/bin/bash
# 20 clean two-node runs (two launchers on loopback, static rendezvous): any hang or straggler line is a false report.
cd "$(dirname "$0")/../../.."
mkdir -p ${TMPDIR:-/tmp}/shoal-clean
false_reports=0
for i in $(seq 1 20); do
  port=$((29600 + i))
  out=${TMPDIR:-/tmp}/shoal-clean/run$i; rm -rf $out
  .venv/bin/python -m shoal train digits --nproc 1 --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port $port --epochs 2 --out $out > ${TMPDIR:-/tmp}/shoal-clean/n1-$i.log 2>&1 &
  p1=$!
  .venv/bin/python -m shoal train digits --nproc 1 --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port $port --epochs 2 --out $out > ${TMPDIR:-/tmp}/shoal-clean/n0-$i.log 2>&1
  c0=$?; wait $p1; c1=$?
  n=$(grep -il "hang\|straggler" ${TMPDIR:-/tmp}/shoal-clean/n0-$i.log ${TMPDIR:-/tmp}/shoal-clean/n1-$i.log | wc -l)
  false_reports=$((false_reports + n))
  echo "run $i: exit $c0/$c1, files with a hang/straggler line: $n"
done
echo "false reports: $false_reports"
