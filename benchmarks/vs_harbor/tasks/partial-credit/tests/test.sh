#!/bin/bash
n=0; for f in a b c d; do [ -f /app/$f.txt ] && n=$((n+1)); done
python3 -c "print($n / 4)" > /logs/verifier/reward.txt
