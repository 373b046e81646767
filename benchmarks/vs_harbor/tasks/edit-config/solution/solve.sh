#!/bin/bash
set -e
sed -i 's/^debug = true/debug = false/' /app/config.ini
