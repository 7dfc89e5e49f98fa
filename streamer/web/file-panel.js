// File transcription: a drop zone and a file input upload to the OpenAI-compatible file endpoint
// with progress, then the transcript is shown with segment times and offered as SRT and VTT.

import { apiUrl, authHeaders, errorMessage } from "./api.js";
import { toSrt, toVtt } from "./subtitles.js";

const $ = (id) => document.getElementById(id);

/** "m:ss.s" for a time in seconds. */
export function clockTime(seconds) {
  const tenths = Math.max(0, Math.round(seconds * 10));
  const m = Math.floor(tenths / 600);
  const s = ((tenths % 600) / 10).toFixed(1).padStart(4, "0");
  return `${m}:${s}`;
}

/**
 * POST `file` as multipart form data; `onProgress(fraction)` while uploading, `onUploaded()` once
 * the server has all the bytes (it is transcribing then). Returns {promise, abort}.
 */
function upload(path, file, fields, { onProgress, onUploaded }) {
  const xhr = new XMLHttpRequest();
  const promise = new Promise((resolve, reject) => {
    const form = new FormData();
    form.append("file", file, file.name);
    for (const [name, value] of fields) form.append(name, value);
    xhr.open("POST", apiUrl(path));
    for (const [name, value] of Object.entries(authHeaders())) xhr.setRequestHeader(name, value);
    xhr.upload.onprogress = (event) => event.lengthComputable && onProgress(event.loaded / event.total);
    xhr.upload.onload = onUploaded;
    xhr.onload = () => {
      if (xhr.status < 200 || xhr.status >= 300) return reject(new Error(errorMessage(xhr.status, xhr.responseText)));
      try {
        resolve(JSON.parse(xhr.responseText));
      } catch {
        reject(new Error("The server's reply is not JSON."));
      }
    };
    xhr.onerror = () => reject(new Error("Network error: the upload did not reach the server."));
    xhr.onabort = () => reject(new Error("Upload cancelled."));
    xhr.send(form);
  });
  return { promise, abort: () => xhr.abort() };
}

/** Wire the file panel. `settings()` returns {model, language (null: detect), task} when a file comes. */
export function setupFilePanel(settings) {
  const drop = $("drop");
  const input = $("file-input");
  const progress = $("file-progress");
  const status = $("file-status");
  const result = $("file-result");
  const links = { srt: $("download-srt"), vtt: $("download-vtt") };
  let current = null; // the upload in flight
  const objectUrls = [];

  function setDownloads(segments, baseName) {
    objectUrls.splice(0).forEach((url) => URL.revokeObjectURL(url));
    for (const [kind, text, type] of [["srt", toSrt(segments), "application/x-subrip"], ["vtt", toVtt(segments), "text/vtt"]]) {
      const url = URL.createObjectURL(new Blob([text], { type: `${type};charset=utf-8` }));
      objectUrls.push(url);
      links[kind].href = url;
      links[kind].download = `${baseName}.${kind}`;
      links[kind].hidden = false;
    }
  }

  function showResult(body, baseName) {
    let segments = Array.isArray(body.segments) ? body.segments : [];
    if (segments.length === 0 && body.text) segments = [{ start: 0, end: body.duration ?? 0, text: body.text }];
    const facts = [body.language && `language ${body.language}`, body.duration != null && `${Number(body.duration).toFixed(1)} s of audio`];
    status.textContent = `Done${facts.some(Boolean) ? ": " + facts.filter(Boolean).join(", ") : ""}.`;
    const list = document.createElement("ol");
    list.className = "segments";
    for (const segment of segments) {
      const item = document.createElement("li");
      const at = document.createElement("span");
      at.className = "at";
      at.textContent = `${clockTime(segment.start)} – ${clockTime(segment.end)}`;
      item.append(at, " ", String(segment.text ?? "").trim());
      list.append(item);
    }
    result.replaceChildren(list);
    setDownloads(segments, baseName);
  }

  async function transcribe(file) {
    if (!file) return;
    current?.abort();
    const { model, language, task } = settings();
    const translate = task === "translate";
    const fields = [["model", model], ["response_format", "verbose_json"]];
    if (!translate) {
      fields.push(["timestamp_granularities[]", "segment"]);
      if (language && language !== "auto") fields.push(["language", language]);
    }
    links.srt.hidden = links.vtt.hidden = true;
    result.replaceChildren();
    progress.hidden = false;
    progress.value = 0;
    status.textContent = `Uploading ${file.name}…`;
    const baseName = file.name.replace(/\.[^.]*$/, "") || "transcript";
    const job = upload(translate ? "v1/audio/translations" : "v1/audio/transcriptions", file, fields, {
      onProgress: (fraction) => (progress.value = fraction),
      onUploaded: () => {
        progress.removeAttribute("value"); // indeterminate while the server works
        status.textContent = "Transcribing…";
      },
    });
    current = job;
    try {
      const body = await job.promise;
      if (current !== job) return;
      progress.value = 1;
      showResult(body, baseName);
    } catch (error) {
      if (current !== job) return;
      progress.hidden = true;
      status.textContent = `Failed: ${error.message}`;
    } finally {
      if (current === job) current = null;
    }
  }

  input.addEventListener("change", () => {
    transcribe(input.files[0]);
    input.value = ""; // choosing the same file again still fires `change`
  });
  drop.addEventListener("dragover", (event) => {
    event.preventDefault();
    drop.classList.add("dragging");
  });
  drop.addEventListener("dragleave", () => drop.classList.remove("dragging"));
  drop.addEventListener("drop", (event) => {
    event.preventDefault();
    drop.classList.remove("dragging");
    transcribe(event.dataTransfer.files[0]);
  });
  // A file dropped beside the zone must not make the browser navigate away from the page.
  window.addEventListener("dragover", (event) => event.preventDefault());
  window.addEventListener("drop", (event) => event.preventDefault());
}
