#!/bin/bash
if [ "$(cat /app/sum.txt)" = "$EXPECTED_SUM" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
