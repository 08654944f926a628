#!/usr/bin/env bash
# One call on a GPU machine: #33's decode step of this tree against an older one, alternated (each run a
# process of its own: bench/decode.py's figures differ by a few percent between processes), the attention's
# head split Q = 4 and 2 (8 last) against 1 at a 128- and a 512-key cache, #27's launch_cost, and a trace of Q = 4.
# Logs go into $OUT/logs.tgz after each run (a call brings back 8 files at most, and a run cut by the
# device's time limit still leaves the runs before it).
#   prepare (here, with git):  mkdir -p .gpu/base .gpu/cur
#                              git archive REV netcl bench | tar -x -C .gpu/base    (the tree to compare with)
#                              git archive HEAD | tar -x -C .gpu/cur                (this tree, frozen)
#   run (device tool, carry .gpu):  LIMIT=400 bash bench/decode_ab.sh
set -u
LIMIT=${LIMIT:-400}; T0=$SECONDS
left() { echo $((LIMIT - (SECONDS - T0))); }
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; LOGS=/tmp/logs; mkdir -p $LOGS
if [ -f .gpu/setup.sh ]; then
  source .gpu/setup.sh > "$LOGS/setup.txt" 2>&1 || { cat "$LOGS/setup.txt"; exit 1; }
  tail -2 "$LOGS/setup.txt"
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
export NETCL_CACHE_DIR=/tmp/netcl-cache PYTHONUNBUFFERED=1
SITE=${PYTHONPATH:-}  # what setup.sh exported (the wheels): kept behind each tree, never replaced
ROOT=${CUR:-$PWD/.gpu/cur}; BASE=${BASE:-$PWD/.gpu/base}
for tree in "$ROOT" "$BASE"; do [ -f "$tree/bench/decode.py" ] || { echo "no $tree/bench/decode.py (see prepare)"; exit 2; }; done
P="--gpu --batches 1 --no-torch --repeats 3"
dec() { local tree=$1 label=$2; shift 2; local t=$(left); [ "$t" -gt 50 ] || { echo "skip $label"; return; }
  echo "== $label $*"; (cd "$tree" && PYTHONPATH=$tree${SITE:+:$SITE} timeout $((t - 20)) python3 bench/decode.py $P \
    --out "$LOGS/$label.json" "$@" > "$LOGS/$label.txt" 2>&1; echo "rc=$?")
  grep -E "netcl generate|copy bandwidth|Error|error" "$LOGS/$label.txt" | head -4
  case $label in *t) tail -32 "$LOGS/$label.txt";; esac; tar czf "$OUT/logs.tgz" -C /tmp logs; }
G="--gen-tokens 48"; L="--prompt-tokens 450 --gen-tokens 32"
dec "$ROOT" C1 $G; dec "$ROOT" Q4 $G --attention-head-split 4; dec "$BASE" B1 $G
dec "$ROOT" C2 $G; dec "$ROOT" Q4b $G --attention-head-split 4
dec "$ROOT" L1 $L; dec "$ROOT" LQ4 $L --attention-head-split 4; dec "$ROOT" Q2 $G --attention-head-split 2
dec "$BASE" B2 $G
t=$(left); [ "$t" -gt 70 ] && { echo "== launch_cost"; (cd "$ROOT" && PYTHONPATH=$ROOT${SITE:+:$SITE} timeout $((t - 15)) \
  python3 bench/launch_cost.py --gpu --steps mlp,cnn,resnet,gpt --python-only > "$LOGS/launch_cost.txt" 2>&1; echo "rc=$?")
  tail -16 "$LOGS/launch_cost.txt"; tar czf "$OUT/logs.tgz" -C /tmp logs; }
dec "$ROOT" Q4t $G --attention-head-split 4 --trace
dec "$ROOT" Q8 $G --attention-head-split 8
echo "done in $((SECONDS - T0)) s"
