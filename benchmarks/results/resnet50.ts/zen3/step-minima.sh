#!/bin/bash
# Per-step minima of model modules run in alternating order (anyshape run --profile):
#   step-minima.sh ANYSHAPE IMAGE_SIZE ROUNDS MODULE...
# Each round runs every module once (one process each, the order reversed every other
# round: the second process of a pair ran slower on this machine), and for every step
# label prints each module's minimum over the rounds, then their sums.
BIN=$1; S=$2; R=$3; shift 3
cd "$(dirname "$0")/../../../.."
for r in $(seq "$R"); do
  if [ $((r % 2)) = 0 ]; then order=$(printf "%s\n" "$@" | tac); else order="$*"; fi
  for m in $order; do
    RUST_BACKTRACE=0 "$BIN" run --module "$m" --inputs "models/full/resnet50.ts.i$S.npz" \
      --profile --seconds 0.2 2>&1 | grep -E "^ +[0-9.]+ ms" | sed "s|^|$(basename "$m") |"
  done
done | python3 -c "
import sys, re, collections
best = collections.defaultdict(lambda: float('inf'))
for line in sys.stdin:
    m, rest = line.split(' ', 1)
    t = float(rest.split()[0])
    label = re.sub(r'N=.*?,K', 'N=..,K', rest.split('x  ', 1)[1].strip())
    best[(m, label)] = min(best[(m, label)], t)
mods = sorted({k[0] for k in best}, key=lambda m: sys.argv[1:].index(m) if m in sys.argv[1:] else 0)
print(' | '.join(mods))
total = dict.fromkeys(mods, 0.0)
for label in sorted({k[1] for k in best}):
    row = [best.get((m, label), float('inf')) for m in mods]
    for m, v in zip(mods, row):
        total[m] += 0 if v == float('inf') else v
    print(' '.join('%8.3f' % (0 if v == float('inf') else v) for v in row), label)
print(' '.join('%8.3f' % total[m] for m in mods), 'sum of the per-step minima')
" $(for m in "$@"; do basename "$m"; done)
