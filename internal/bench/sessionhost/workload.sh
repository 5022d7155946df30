#!/bin/bash
# A knowledge worker's day in a loop, run by the session's xterm: each
# action is timed here, inside the session, so that the RDP path does
# not blur it, and sent to the bench as one line per action.
#
# Arguments: the bench's address (host:port), the run's token, the think
# time between actions in milliseconds. Files are under ~/workload (the
# bench writes them before the user logs on).
export LC_ALL=C
report=$1 token=$2 think_ms=$3
host=${report%:*} port=${report##*:}
dir=$HOME/workload
think=$(printf '%d.%03d' $((think_ms / 1000)) $((think_ms % 1000)))

# send reports one action's time (or "failed" with a reason) on its own
# connection, so that a report never waits on an earlier one.
send() {
	{ exec 3<>"/dev/tcp/$host/$port" && printf '%s %s %s %s\n' "$token" "$USER" "$1" "$2" >&3 && exec 3>&-; } 2>/dev/null
}

# timed runs "$@" and reports its time as action $1's.
timed() {
	local name=$1 start=$EPOCHREALTIME end
	why=
	shift
	if "$@"; then
		end=$EPOCHREALTIME
		send "$name" $(((${end/./} - ${start/./}) / 1000))
	else
		send "$name" failed
		printf '%s %s failed: %s\n' "$(date +%T.%N)" "$name" "$why" >>"$dir/failures.log"
	fi
}

# edit opens a note in an editor in its own window, types a sentence into
# it as a person would (a key every 15 ms), saves and quits, and checks
# the sentence reached the file. The editor writes a copy of the note
# once it has started (-c runs after it took over the terminal): keys
# sent before that would reach the terminal's line discipline instead.
edit() {
	local title=edit-$$-$RANDOM line="The quarterly figures for $RANDOM look fine; send them to the team by Friday."
	local ready=$dir/.editor-ready i=0
	rm -f "$ready"
	xterm -xrm 'XTerm*allowSendEvents: true' -xrm 'XTerm*allowTitleOps: false' -title "$title" \
		-geometry 90x20+60+60 -e vim.tiny -u NONE -N -n -c "w! $ready" "$dir/note.txt" &
	local pid=$! wid
	wid=$(xdotool search --sync --onlyvisible --name "^$title\$" | head -n 1) || { why="no editor window"; return 1; }
	until [ -e "$ready" ]; do
		((i++ < 3000)) || { why="the editor did not start in a minute"; return 1; }
		sleep 0.02
	done
	# Each step is sent on its own so that a failure names it. Saving
	# (":w") leaves the window up; quitting closes it while xdotool may
	# still be sending the key's release to it, an X error about a window
	# that is gone, so the quit is not checked by its exit status but by
	# the editor ending.
	local step err
	for step in "type Go$line" "key Escape" "type :w" "key Return"; do
		err=$(xdotool ${step%% *} --window "$wid" --delay 15 "${step#* }" 2>&1 >/dev/null) ||
			{ why="xdotool ${step%% *} failed: $(printf %s "$err" | grep -v XGetInputFocus | head -n 4 | tr '\n' '|')"; return 1; }
	done
	xdotool type --window "$wid" --delay 15 ":q" 2>/dev/null && xdotool key --window "$wid" Return 2>/dev/null
	i=0
	while kill -0 $pid 2>/dev/null; do
		((i++ < 1500)) || { why="the editor did not quit in 30 s"; kill $pid; return 1; }
		sleep 0.02
	done
	wait $pid
	grep -qF "$line" "$dir/note.txt" || { why="the note ends: $(tail -c 200 "$dir/note.txt" | tr '\n' '|')"; return 1; }
}

# search looks for phrases in a large text file.
# (The count goes to a variable: with its output on /dev/null, grep
# stops at the first match.)
search() {
	local n
	n=$(grep -c -i -E "(budget|invoice) [a-z]+ (meridian|forecast)" "$dir/big.txt") && [ "$n" -gt 0 ]
}

# compress packs a document and unpacks it again.
compress() {
	gzip -c "$dir/doc.txt" >"$dir/doc.txt.gz" && gunzip -c "$dir/doc.txt.gz" | cmp -s - "$dir/doc.txt"
}

# files lists a folder and opens every file in it.
files() {
	ls -l "$dir/files" >/dev/null && cat "$dir"/files/* >/dev/null
}

# scroll shows a long document in this terminal. The terminal answers
# the cursor position query only once it has taken in everything before
# it, so the time is the terminal's, not just the pipe's.
scroll() {
	cat "$dir/long.txt" && printf '\033[6n' && IFS= read -r -s -d R -t 60 _
}

send ready 0
while :; do
	for a in edit search compress files scroll; do
		timed "$a" "$a"
		sleep "$think"
	done
done
