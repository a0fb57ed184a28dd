#!/bin/sh
# Installs Debian's Chromium unless a `chromium` is already on PATH (idempotent; apt-get needs root).
# Used by the report's headless-browser test and by kaleido for static figure export (PDF/SVG/PNG);
# nothing downloads a browser any other way.
set -e
command -v chromium >/dev/null 2>&1 || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium)
