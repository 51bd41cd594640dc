#!/usr/bin/env bash
# Headless OpenGL for MuJoCo's renderer (videos, `myriad render`, the video tests): Mesa's EGL.
# Installs the Debian packages when absent; does nothing when they are there.
set -euo pipefail
GL_PACKAGES="libegl1 libegl-mesa0 libgl1-mesa-dri"
gl_installed() {
  for package in $GL_PACKAGES; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || return 1
  done
}
command -v dpkg-query >/dev/null || exit 0  # not a Debian system: see docs/visualization.md
gl_installed && exit 0
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $GL_PACKAGES
