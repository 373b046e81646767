#!/bin/bash
set -e
mkdir -p /app/project/src /app/project/docs && touch /app/project/README.md
