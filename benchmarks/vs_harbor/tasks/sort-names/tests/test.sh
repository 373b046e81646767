#!/bin/bash
if [ "$(cat /app/sorted.txt | tr "\n" ,)" = "alice,bob,carol," ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
