#!/bin/bash
# Kelvin: PrologSlurmctld and EpilogSlurmctld. Tells the Slurm bridge that a job
# started or ended, so it reconciles at once and knows the time to the
# nanosecond (Slurm keeps seconds). A hint only: the bridge polls Slurm anyway.
#
# It returns at once and always exits 0 (a failing PrologSlurmctld would requeue
# the job): the notification is sent in the background, in its own session,
# with a 3 s timeout.
# Configuration: kelvin-notify.conf next to this script, KEY=VALUE lines:
#   KELVIN_BRIDGE_URL=http://kelvin-slurm-bridge:8084
#   KELVIN_TOKEN_FILE=/etc/slurm/kelvin-notify.token   (the bridge's notify_token)
# `kelvin slurm files --dir /etc/slurm ...` writes both.
PATH=/usr/bin:/bin

send() {
  # the token comes in the environment, not the command line (which `ps` shows everyone)
  local url="$1" body="$2" token="${KELVIN_NOTIFY_TOKEN:-}" hostport host port
  if [ -x /usr/bin/curl ]; then
    # headers from stdin (-H @-): the token stays off the command line here too
    printf 'Content-Type: application/json\n%s' "${token:+Authorization: Bearer $token}" |
      /usr/bin/curl -s -o /dev/null -m 3 -X POST -H @- --data "$body" "$url/api/v1/notify"
    return 0
  fi
  case "$url" in http://*) ;; *) return 0 ;; esac  # https needs curl
  hostport="${url#http://}"; hostport="${hostport%%/*}"
  host="${hostport%:*}"; port="${hostport##*:}"
  [ "$port" = "$hostport" ] && port=80
  exec 3<>"/dev/tcp/$host/$port" || return 0
  printf 'POST /api/v1/notify HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%sConnection: close\r\n\r\n%s' \
    "$hostport" "${#body}" "${token:+Authorization: Bearer $token$'\r\n'}" "$body" >&3
  read -r -t 3 _ <&3
  exec 3>&-
}

if [ "$1" = "--send" ]; then
  send "$2" "$3"
  exit 0
fi

case "$SLURM_SCRIPT_CONTEXT" in
  prolog_slurmctld) event=start ;;
  epilog_slurmctld) event=end ;;
  *) exit 0 ;;
esac
id="${SLURM_JOB_ID:-}"
case "$id" in '' | *[!0-9_]*) exit 0 ;; esac

url="" token_file=""
conf="${0%/*}/kelvin-notify.conf"
if [ -r "$conf" ]; then
  while IFS='=' read -r key value; do
    case "$key" in
      KELVIN_BRIDGE_URL) url="$value" ;;
      KELVIN_TOKEN_FILE) token_file="$value" ;;
    esac
  done < "$conf"
fi
[ -n "$url" ] || exit 0
token=""
[ -n "$token_file" ] && [ -r "$token_file" ] && read -r token < "$token_file"

body="{\"event\":\"$event\",\"job_id\":\"$id\"}"
export KELVIN_NOTIFY_TOKEN="$token"
# In its own session (setsid): slurmctld kills the script's process group when it returns.
run=("$0" --send "${url%/}" "$body")
[ -x /usr/bin/timeout ] && run=(/usr/bin/timeout 3 "${run[@]}")
[ -x /usr/bin/setsid ] && run=(/usr/bin/setsid -f "${run[@]}")
"${run[@]}" </dev/null >/dev/null 2>&1 &
exit 0
