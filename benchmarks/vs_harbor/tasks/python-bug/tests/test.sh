#!/bin/bash
cd /tests
if python3 -m unittest -q test_stats; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
