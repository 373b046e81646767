#!/bin/bash
set -e
printf 'hello, harbor\n' > /app/greeting.txt
