// SRT and WebVTT subtitles from verbose_json segments ({start, end, text}, times in seconds).
// Pure functions: no DOM, so they can be checked outside a browser.

function pad(value, width) {
  return String(value).padStart(width, "0");
}

/** "HH:MM:SS,mmm" (SRT, separator ",") or "HH:MM:SS.mmm" (VTT, separator "."). */
export function subtitleTime(seconds, separator) {
  const ms = Math.max(0, Math.round(seconds * 1000));
  const h = Math.floor(ms / 3600000);
  const m = Math.floor(ms / 60000) % 60;
  const s = Math.floor(ms / 1000) % 60;
  return `${pad(h, 2)}:${pad(m, 2)}:${pad(s, 2)}${separator}${pad(ms % 1000, 3)}`;
}

// One line of text per cue: a blank line inside a cue would end it early in both formats.
function cues(segments) {
  return segments
    .map((segment) => ({
      start: Number(segment.start) || 0,
      end: Math.max(Number(segment.end) || 0, Number(segment.start) || 0),
      text: String(segment.text ?? "").replace(/\s+/g, " ").trim(),
    }))
    .filter((cue) => cue.text !== "");
}

/** SubRip: numbered cues, comma before the milliseconds; "-->" in a text would read as a timing line. */
export function toSrt(segments) {
  return cues(segments)
    .map((cue, i) => `${i + 1}\n${subtitleTime(cue.start, ",")} --> ${subtitleTime(cue.end, ",")}\n${cue.text.replaceAll("-->", "->")}\n`)
    .join("\n");
}

/** WebVTT: header, dot before the milliseconds, and &, <, > escaped (cue text is markup there);
 * streamer/longform/formats.py renders both formats the same way. */
export function toVtt(segments) {
  const escape = (text) => text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  const body = cues(segments)
    .map((cue) => `${subtitleTime(cue.start, ".")} --> ${subtitleTime(cue.end, ".")}\n${escape(cue.text)}\n`)
    .join("\n");
  return `WEBVTT\n\n${body}`;
}
