#!/bin/bash
if grep -qx 'debug = false' /app/config.ini && grep -qx 'name = demo' /app/config.ini; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
