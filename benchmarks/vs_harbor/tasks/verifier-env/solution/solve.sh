#!/bin/bash
set -e
python3 -c "print(sum(int(x) for x in open('/app/numbers.txt')))" > /app/sum.txt
