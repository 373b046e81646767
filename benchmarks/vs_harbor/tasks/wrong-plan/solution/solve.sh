#!/bin/bash
set -e
sed -i 's/cat/dog/g' /app/pets.txt
