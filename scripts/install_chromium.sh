#!/bin/sh
# Installs Debian's Chromium (used by the report's browser test and by kaleido for static figure
# export) unless a `chromium` is already on PATH. Idempotent; needs root for apt-get.
set -e
command -v chromium >/dev/null 2>&1 || (apt-get update && apt-get install -y chromium)
