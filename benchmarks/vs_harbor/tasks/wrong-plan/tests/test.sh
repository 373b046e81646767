#!/bin/bash
if ! grep -q cat /app/pets.txt && [ "$(grep -c dog /app/pets.txt)" = 2 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
