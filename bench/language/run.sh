#!/usr/bin/env bash
# bench/language: how many messages per second one core of
# pepsi-stage-detect-language's detection gets through, on messages of
# about 2 KB of text.
#
# The texts are the translations Debian ships (t/bin/catalog-texts: the
# message catalogs of coreutils, tar, dpkg and apt), in ten languages,
# joined to about 2,000 characters each and sent as messages in the shapes
# mail has (8-bit UTF-8, quoted-printable, base64, a legacy charset,
# multipart/alternative with HTML).  pepsi-detect-language, the stage's
# own file under its other name, reads them all in one process: the MIME
# decoding, the charset conversion and libexttextcat's classification the
# stage does per message, without the queue's round trips (bench/stages
# measures those).  Messages per CPU second of that process is the rate
# per core; the models' loading, once per worker, is measured apart and
# taken out.
#
# Two sides, in turns (A, B, A, B...) so that they share the machine's
# load: every model libexttextcat-data ships (the default), and only the
# ten languages (LANGUAGES).  BENCH_REPS runs of each (5): the median and
# the spread (lowest..highest), the load average before and after.  Also
# printed: how many of the messages each side named right.  Reports, never
# judges: exits 0 unless the benchmark itself broke.
#
# Knobs: BENCH_REPS (5), BENCH_COPIES (each message read this many times
# per run, 5), BENCH_LANGUAGES (de fr es pt nl sv pl cs fi ru).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
# shellcheck source=../lib.sh
. "$here/../lib.sh"

reps=${BENCH_REPS:-5}
copies=${BENCH_COPIES:-5}
languages=${BENCH_LANGUAGES:-de fr es pt nl sv pl cs fi ru}
detect=${PEPSI_BIN:-$top/build/bin}/pepsi-detect-language
[ -x "$detect" ] || { echo "bench/language: $detect is missing: make all first" >&2; exit 1; }
work=$(mktemp -d /tmp/pepsi-bench-language.XXXXXX)
trap 'rm -rf "$work"' EXIT

# The messages: per language, its catalog texts joined to about 2 KB each.
for lang in $languages; do
    "$top/t/bin/catalog-texts" -n 40 -m 2000 "$lang" "$work/texts" >/dev/null \
        || "$top/t/bin/catalog-texts" -n 10 -m 2000 "$lang" "$work/texts" >/dev/null \
        || { echo "bench/language: too few $lang texts in the catalogs (scripts/deps.sh)" >&2; exit 1; }
done
perl -MEncode=encode -MMIME::Base64 -MMIME::QuotedPrint -e '
    my ($dir, $out) = @ARGV;
    my @shapes = qw(utf8 qp base64 legacy multipart);
    my %legacy = (pl => "iso-8859-2", cs => "iso-8859-2", ru => "koi8-r");
    my $n = 0;
    mkdir $out;
    for my $file (sort glob("$dir/*.txt")) {
        my ($lang) = $file =~ m{/(\w+)-\d+\.txt$};
        open my $fh, "<:encoding(UTF-8)", $file or die; local $/; my $text = <$fh>; close $fh;
        my $utf8 = encode("UTF-8", $text) =~ s/\r?\n/\r\n/gr;
        my $shape = $shapes[$n++ % @shapes];
        my $h = "From: <a\@example.org>\r\nTo: <b\@example.org>\r\nSubject: $lang\r\nMIME-Version: 1.0\r\n";
        my $body;
        if ($shape eq "utf8") { $h .= "Content-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: 8bit\r\n"; $body = $utf8 }
        elsif ($shape eq "qp") { $h .= "Content-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: quoted-printable\r\n"; $body = encode_qp($utf8, "\r\n") }
        elsif ($shape eq "base64") { $h .= "Content-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: base64\r\n"; $body = encode_base64($utf8, "\r\n") }
        elsif ($shape eq "legacy") {
            my $cs = $legacy{$lang} // "iso-8859-15";
            my $octets = eval { encode($cs, $text, Encode::FB_CROAK) };
            ($cs, $octets) = ("utf-8", $utf8) unless defined $octets;
            $h .= "Content-Type: text/plain; charset=$cs\r\nContent-Transfer-Encoding: base64\r\n"; $body = encode_base64($octets, "\r\n");
        } else {
            $h .= "Content-Type: multipart/alternative; boundary=b\r\n";
            $body = "--b\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\n"
              . encode_qp($utf8, "\r\n") . "\r\n--b\r\nContent-Type: text/html; charset=utf-8\r\nContent-Transfer-Encoding: base64\r\n\r\n"
              . encode_base64("<html><body><p>$utf8</p></body></html>", "\r\n") . "--b--\r\n";
        }
        open my $m, ">", sprintf("%s/%04d-%s.eml", $out, $n, $lang) or die; binmode $m; print $m "$h\r\n$body"; close $m;
    }' "$work/texts" "$work/messages"
mapfile -t messages < <(ls "$work/messages"/*.eml)
files=()
for _ in $(seq "$copies"); do files+=("${messages[@]}"); done
count=${#files[@]}
bytes=$(cat "${messages[@]}" | wc -c)
echo "bench/language: ${#messages[@]} messages (about $((bytes / ${#messages[@]})) bytes each) in $(echo "$languages" | wc -w) languages, each read $copies times per run: $count per run"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"

# CPU seconds (user + system) of a command, its output to $work/out.
cpu_seconds() {
    local t
    t=$( { TIMEFORMAT='%U %S'; time "$@" >"$work/out" 2>"$work/err"; } 2>&1 ) || { cat "$work/err" >&2; return 1; }
    awk '{ printf "%.4f", $1 + $2 }' <<<"$t"
}

tags=$(echo "$languages" | tr ' ' ',')
declare -A rates right
for rep in $(seq "$reps"); do
    for side in all ten; do
        opts=()
        [ "$side" = ten ] && opts=(-l "$tags")
        # The models' loading alone: one empty text.
        load=$(cpu_seconds "$detect" -t "${opts[@]}" /dev/null)
        total=$(cpu_seconds "$detect" "${opts[@]}" "${files[@]}")
        rate=$(awk -v n="$count" -v t="$total" -v l="$load" 'BEGIN { d = t - l; if (d <= 0) d = 0.0001; printf "%.0f", n / d }')
        rates[$side]+="$rate "
        ok=$(paste <(printf '%s\n' "${files[@]}") "$work/out" \
            | awk -F'\t' '{ n = split($1, p, "[-.]"); lang = p[n - 1]; split($2, v, ";"); sub(/^.*: /, "", v[1]); if (v[1] == lang) ok++ } END { print ok + 0 }')
        right[$side]=$ok
        printf '  run %d %-3s %8s messages/s per core (models loaded in %.3f s CPU), %d/%d named right\n' \
            "$rep" "$side" "$rate" "$load" "$ok" "$count"
    done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
for side in all ten; do
    # shellcheck disable=SC2086
    median=$(bench_median ${rates[$side]})
    # shellcheck disable=SC2086
    lowest=$(min ${rates[$side]})
    # shellcheck disable=SC2086
    highest=$(max ${rates[$side]})
    label=$([ "$side" = all ] && echo "every model" || echo "LANGUAGES = $tags")
    printf 'detect-language, %s: median %.0f messages/s per core (spread %s..%s over %d runs), %d/%d named right\n' \
        "$label" "$median" "$lowest" "$highest" "$reps" "${right[$side]}" "$count"
done
