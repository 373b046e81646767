#!/bin/bash
if [ -d /app/project/src ] && [ -d /app/project/docs ] && [ -f /app/project/README.md ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
