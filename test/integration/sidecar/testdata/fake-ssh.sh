#!/bin/sh
# Stand-in for ssh: drop ssh options, take the host, run the command locally
# in a UTS namespace whose hostname is that host.
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-p|-l|-i|-F) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
host=$1; shift
exec unshare --uts sh -c "hostname '$host' && $*"
