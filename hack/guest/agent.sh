# The guest's command agent, PID 1 (busybox sh, from init). On the
# virtio-serial port named snapcsi.agent it reads one command per line (base64 of a shell script), runs it with
# /bin/sh and answers one line: "<exit status> <base64 stdout> <base64 stderr>".
# One command at a time; a command that starts a service redirects its output
# and puts it in the background. As PID 1 it also reaps what the commands
# leave behind (the shell waits for any child between commands).
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
port=
for p in /sys/class/virtio-ports/*; do
  [ "$(cat "$p/name" 2>/dev/null)" = snapcsi.agent ] && port=/dev/${p##*/}
done
if [ -z "$port" ]; then
  echo "guest: no virtio-serial port named snapcsi.agent" >/dev/console
  exec /run/snapcsi-guest/busybox poweroff -f
fi
work=/run/snapcsi-guest
# The port reads end-of-file while no one is connected on the outside: wait
# for the harness (it connects once per boot, and asks first for the release).
# A command never holds the port (3>&-): a service it leaves running would
# keep the port busy, and PID 1 could not open it again.
while :; do
  exec 3<>"$port"
  while read -r line <&3; do
    echo "$line" | base64 -d >"$work/cmd"
    /bin/sh "$work/cmd" </dev/null >"$work/out" 2>"$work/err" 3>&-
    echo "$? $(base64 -w0 <"$work/out") $(base64 -w0 <"$work/err")" >&3
  done
  exec 3<&-
  sleep 0.2
done
