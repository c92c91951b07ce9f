#!/bin/sh
# Fails unless $1 exists, is not empty and starts with a PDF header.
set -eu
file="$1"
[ -s "$file" ] || { echo "empty or missing: $file" >&2; exit 1; }
head -c 5 "$file" | grep -q '%PDF-' || { echo "not a PDF: $file" >&2; exit 1; }
echo "ok: $file"
