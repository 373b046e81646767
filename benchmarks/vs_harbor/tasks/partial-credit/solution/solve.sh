#!/bin/bash
set -e
touch /app/a.txt /app/b.txt /app/c.txt /app/d.txt
