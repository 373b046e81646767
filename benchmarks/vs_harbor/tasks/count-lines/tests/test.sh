#!/bin/bash
if [ "$(tr -d " " < /app/count.txt)" = "17" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
