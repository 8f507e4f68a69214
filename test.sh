#!/usr/bin/env bash
# Runs holdfast's whole test suite: vet, then every package with the race
# detector. The end-to-end tests build the binary themselves and start real
# server processes on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")"
export GOTOOLCHAIN=local
go vet ./...
go test -race -count=1 -timeout 15m "$@" ./...
