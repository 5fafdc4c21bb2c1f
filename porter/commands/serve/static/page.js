// porter serve's page: a client of the server's own JSON API (/settings, /jobs,
// /health), sending the bearer token with every call. Text from the server is set as
// text, never as HTML. Videos and previews are fetched with the token and shown from
// memory (object URLs), so no address carries the token.
"use strict";

const TOKEN_KEY = "porter.token";
const POLL_MS = 1000;
// each number the form shows: its label and a line on what it does
const NUMBERS = {
  width: ["Width", "pixels across"],
  height: ["Height", "pixels down"],
  frames: ["Frames", "the video's length"],
  steps: ["Steps", "denoising steps: more for detail, fewer for speed"],
  seed: ["Seed", "the same seed and settings make the same video"],
  guidance_scale: ["Guidance", "how closely the video follows the prompt (1: not guided)"],
};
const STATES = {queued: "queued", running: "running", done: "done", failed: "failed",
                cancelled: "cancelled"};

let token = localStorage.getItem(TOKEN_KEY) || "";
let settings = null;
let polling = null;
let announced = null;  // the job the line under the form says was queued
const rows = new Map();  // job id -> its row's elements and what they show

const $ = (id) => document.getElementById(id);

class Unauthorized extends Error {}

function element(tag, attributes = {}, text = "") {
  const made = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) made.setAttribute(key, value);
  if (text) made.textContent = text;
  return made;
}

// A call to the server with the token; a 401 asks for the token again.
async function call(path, options = {}) {
  const headers = Object.assign({}, options.headers || {});
  if (token) headers.Authorization = "Bearer " + token;
  const answer = await fetch(path, Object.assign({}, options, {headers}));
  if (answer.status === 401) {
    askToken(token ? "The server refused that token." : "");
    throw new Unauthorized();
  }
  return answer;
}

async function blobUrl(path) {
  const answer = await call(path, {cache: "no-store"});
  if (!answer.ok) return null;
  return URL.createObjectURL(await answer.blob());
}

function askToken(message) {
  clearTimeout(polling);
  polling = null;
  $("app").hidden = true;
  $("token").hidden = false;
  $("token-said").textContent = message;
  $("token-input").focus();
}

async function start() {
  let answer;
  try {
    answer = await call("/settings");
  } catch (error) {
    if (!(error instanceof Unauthorized)) say("The server cannot be reached: " + error, true);
    return;
  }
  settings = await answer.json();
  $("token").hidden = true;
  $("app").hidden = false;
  $("forget").hidden = !token;
  $("model").textContent = `${settings.recipe} (${settings.family})`;
  document.title = `Porter: ${settings.recipe}`;
  fillForm(settings);
  poll();
}

function fillForm(found) {
  const gen = found.generate;
  $("f-prompt").value = gen.prompt || "";
  $("f-negative_prompt").value = gen.negative_prompt || "";
  const numbers = $("numbers");
  numbers.replaceChildren();
  for (const [key, [label, explained]] of Object.entries(NUMBERS)) {
    const box = element("div");
    box.append(element("label", {for: "f-" + key}, label));
    const input = element("input", {id: "f-" + key, name: key, type: "number", min: "0",
                                    step: key === "guidance_scale" ? "any" : "1",
                                    "aria-describedby": "d-" + key});
    if (gen[key] === null || gen[key] === undefined) input.placeholder = "the model's";
    else input.value = gen[key];
    const more = key === "frames" ? ` (${found.fps} a second)` : "";
    box.append(input, element("small", {id: "d-" + key}, explained + more));
    numbers.append(box);
  }
  const files = $("files");
  files.replaceChildren();
  for (const [key, input] of Object.entries(found.inputs)) {
    const box = element("div");
    const name = key.replace(/_/g, " ");
    box.append(element("label", {for: "f-" + key},
                       name + (input.recipe_has ? " (the recipe's if none)" : "")));
    const accept = {image: "image/*", video: "video/*", either: "image/*,video/*"};
    box.append(element("input", {id: "f-" + key, name: key, type: "file",
                                 accept: accept[input.kind]}));
    files.append(box);
  }
}

function readAsDataUrl(file) {
  return new Promise((done, failed) => {
    const reader = new FileReader();
    reader.onload = () => done(reader.result);
    reader.onerror = () => failed(reader.error);
    reader.readAsDataURL(file);
  });
}

function say(message, bad = false, problems = []) {
  $("said").textContent = message;
  $("said").className = bad ? "bad" : "";
  $("problems").replaceChildren(...problems.map((problem) => element(
    "li", {}, `${problem.path}: ${problem.message}` + (problem.hint ? ` (${problem.hint})` : ""))));
}

// The form as a job's settings: the prompt and what differs from the recipe's values
// (what is left empty or unchanged, the recipe gives).
async function jobSettings() {
  const body = {}, recipe = settings.generate;
  const prompt = $("f-prompt").value.trim();
  if (prompt) body.prompt = prompt;
  const negative = $("f-negative_prompt").value.trim();
  if (negative !== (recipe.negative_prompt || "").trim()) body.negative_prompt = negative;
  for (const key of Object.keys(NUMBERS)) {
    const value = $("f-" + key).value.trim();
    if (value !== "" && Number(value) !== recipe[key]) body[key] = Number(value);
  }
  for (const key of Object.keys(settings.inputs)) {
    const file = $("f-" + key).files[0];
    if (file) body[key] = await readAsDataUrl(file);
  }
  return body;
}

async function submit(event) {
  event.preventDefault();
  $("submit").disabled = true;
  try {
    const answer = await call("/jobs", {method: "POST", body: JSON.stringify(await jobSettings()),
                                        headers: {"Content-Type": "application/json"}});
    const got = await answer.json();
    if (answer.ok) {
      announced = got.id;
      say(`Job ${jobName(got.id)} queued.`);
      await refresh();
    } else {
      say(got.error + (got.hint ? ` (${got.hint})` : ""), true, got.problems || []);
    }
  } catch (error) {
    if (!(error instanceof Unauthorized)) say("Not sent: " + error, true);
  } finally {
    $("submit").disabled = false;
  }
}

// a job as the page names it everywhere: "#1" for job 000001
const jobName = (id) => "#" + Number(id);

function newRow(job) {
  const row = {item: element("li", {class: "job", "data-job": job.id})};
  const head = element("div", {class: "head"});
  head.append(element("strong", {}, jobName(job.id)));
  row.prompt = element("span", {class: "prompt"}, job.settings.prompt || settings.generate.prompt || "");
  row.prompt.title = row.prompt.textContent;
  row.state = element("span", {class: "state"});
  row.cancel = element("button", {type: "button", class: "cancel"}, "cancel");
  row.cancel.addEventListener("click", () => cancel(job.id));
  row.recordButton = element("button", {type: "button", class: "record"}, "run record");
  row.recordButton.hidden = true;
  row.recordButton.addEventListener("click", () => toggleRecord(row, job.id));
  head.append(row.prompt, row.state, row.cancel, row.recordButton);
  row.progress = element("progress", {max: "1", value: "0"});
  row.error = element("p", {class: "error"});
  row.preview = element("img", {class: "preview", alt: "live preview of the latents"});
  row.preview.hidden = true;
  row.video = element("video", {controls: "", loop: "", muted: "", playsinline: "",
                                autoplay: ""});
  row.video.muted = true;
  row.video.hidden = true;
  row.download = element("a", {class: "download", download: `porter-${job.id}.mp4`},
                         "download the video");
  row.download.hidden = true;
  row.record = element("pre", {class: "record"});
  row.record.hidden = true;
  row.item.append(head, row.progress, row.error, row.preview, row.video, row.download,
                  row.record);
  $("jobs").prepend(row.item);  // newest first
  rows.set(job.id, row);
  return row;
}

function stateText(job) {
  if (job.status === "running") {
    const steps = job.steps ? ` · step ${job.step} of ${job.steps}` : "";
    return (job.cancelling ? "cancelling" : "running") + steps;
  }
  if (job.status === "done" && job.started && job.finished)
    return `done in ${(job.finished - job.started).toFixed(1)} s`;
  return STATES[job.status] || job.status;
}

async function render(job) {
  const row = rows.get(job.id) || newRow(job);
  row.item.dataset.status = job.status;
  row.state.textContent = stateText(job);
  row.progress.max = job.steps || 1;
  row.progress.value = job.status === "done" ? row.progress.max : job.step;
  row.cancel.hidden = !(job.status === "queued" || job.status === "running") || job.cancelling;
  row.error.textContent = job.error || "";
  row.recordButton.hidden = !job.record;
  if (job.id === announced && !(job.status === "queued" || job.status === "running")) {
    // "queued" is no longer true (the row says how it ended); a later message stays
    if ($("said").textContent === `Job ${jobName(job.id)} queued.`) say("");
    announced = null;
  }
  if (job.preview && job.status === "running" && job.step !== row.previewStep &&
      !row.framesShown) {
    row.previewStep = job.step;
    const url = await blobUrl(job.preview);
    if (url) {
      if (row.preview.src) URL.revokeObjectURL(row.preview.src);
      row.preview.src = url;
      row.preview.hidden = false;
    }
  }
  if (job.stream && job.status === "running" && !row.streaming) playStream(row, job);
  if (job.video && !row.videoShown) {
    row.videoShown = true;
    const url = await blobUrl(job.video);
    if (url) {
      if (row.video.src.startsWith("blob:")) URL.revokeObjectURL(row.video.src);
      row.video.src = url;  // the finished video (better kept than the stream's)
      row.video.hidden = false;
      row.download.href = url;
      row.download.hidden = false;
      row.preview.hidden = true;
    } else {
      row.videoShown = false;  // try again at the next poll
    }
  }
}

// The codec a fragmented MP4's header names: "avc1." and the profile, its constraint
// flags and the level from the avcC box (null until the header has arrived).
function codecOf(bytes) {
  for (let i = 0; i + 8 <= bytes.length; i++) {
    if (bytes[i] === 0x61 && bytes[i + 1] === 0x76 && bytes[i + 2] === 0x63 &&
        bytes[i + 3] === 0x43) {  // "avcC", then its version byte
      const hex = (b) => b.toString(16).padStart(2, "0");
      return `avc1.${hex(bytes[i + 5])}${hex(bytes[i + 6])}${hex(bytes[i + 7])}`;
    }
  }
  return null;
}

function joined(a, b) {
  const both = new Uint8Array(a.length + b.length);
  both.set(a);
  both.set(b, a.length);
  return both;
}

// A running job's frames as they are decoded: its stream (a fragmented MP4 that grows
// while it runs) fed to the video element through Media Source Extensions, so it
// plays before the job is done. Where the browser cannot, the finished video comes
// as before.
async function playStream(row, job) {
  row.streaming = true;
  if (!window.MediaSource) return;
  let answer;
  try {
    answer = await call(job.stream, {cache: "no-store"});
  } catch (error) {
    return;
  }
  if (!answer.ok || !answer.body) return;
  const reader = answer.body.getReader();
  const source = new MediaSource();
  let head = new Uint8Array(0), buffer = null;
  const queue = [];
  const ended = () => {
    if (source.readyState === "open" && buffer && !buffer.updating && !queue.length)
      source.endOfStream();
  };
  let finished = false;  // the response is over: end the source once the queue is fed
  const feed = () => {
    try {
      if (buffer && !buffer.updating && queue.length) buffer.appendBuffer(queue.shift());
      else if (finished) ended();
    } catch (error) {
      queue.length = 0;  // the element was given the finished video, or a media error
    }
  };
  await new Promise((opened) => {
    source.addEventListener("sourceopen", opened, {once: true});
    row.video.src = URL.createObjectURL(source);
  });
  try {
    for (;;) {
      const read = await reader.read();
      if (read.done || row.videoShown) break;
      if (!buffer) {  // until the header names the codec
        head = joined(head, read.value);
        const codec = codecOf(head);
        if (!codec) continue;
        const kind = `video/mp4; codecs="${codec}"`;
        if (!MediaSource.isTypeSupported(kind)) break;
        buffer = source.addSourceBuffer(kind);
        buffer.addEventListener("updateend", feed);
        queue.push(head);
        row.framesShown = true;  // the frames themselves from now on, not the preview
        row.preview.hidden = true;
        row.video.hidden = false;
      } else {
        queue.push(read.value);
      }
      feed();
    }
  } catch (error) {
    // the connection ended, or the source was closed: the finished video follows
  } finally {
    reader.cancel().catch(() => {});  // a stream left early (the finished video came)
    finished = true;
    feed();
  }
}

async function toggleRecord(row, id) {
  if (!row.record.hidden) {
    row.record.hidden = true;
    return;
  }
  const answer = await call(`/jobs/${id}/record`);
  row.record.textContent = JSON.stringify(await answer.json(), null, 2);
  row.record.hidden = false;
}

async function cancel(id) {
  const answer = await call(`/jobs/${id}`, {method: "DELETE"});
  if (!answer.ok) say((await answer.json()).error, true);
  await refresh();
}

function healthText(health) {
  const waiting = health.queued ? `, ${health.queued} waiting` : "";
  if (!health.ready)
    return `warming up (${health.warmup.done} of ${health.warmup.total})${waiting}`;
  return (health.running ? "working" : "idle") + waiting;
}

async function refresh() {
  const [jobs, health] = await Promise.all([
    call("/jobs").then((answer) => answer.json()),
    call("/health").then((answer) => answer.json())]);
  $("health").textContent = healthText(health);
  const present = new Set(jobs.jobs.map((job) => job.id));
  for (const [id, row] of rows) {
    if (!present.has(id)) {  // deleted by another client
      for (const media of [row.video, row.preview])
        if (media.src) URL.revokeObjectURL(media.src);  // the video's bytes, freed
      row.item.remove();
      rows.delete(id);
    }
  }
  for (const job of jobs.jobs) await render(job);
  $("empty").hidden = rows.size > 0;
}

async function poll() {
  clearTimeout(polling);
  try {
    await refresh();
  } catch (error) {
    if (error instanceof Unauthorized) return;
    $("health").textContent = "the server does not answer";
  }
  polling = setTimeout(poll, POLL_MS);
}

document.addEventListener("DOMContentLoaded", () => {
  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    token = $("token-input").value.trim();
    localStorage.setItem(TOKEN_KEY, token);
    $("token-input").value = "";
    start();
  });
  $("forget").addEventListener("click", () => {
    localStorage.removeItem(TOKEN_KEY);
    token = "";
    location.reload();
  });
  $("job").addEventListener("submit", submit);
  start();
});
