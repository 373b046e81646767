#!/bin/bash
set -e
wc -l < /app/data.txt > /app/count.txt
