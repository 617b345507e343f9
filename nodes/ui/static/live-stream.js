// One live stream of the UI (GET /ui/stream) carrying the topics of a browser's
// open pages: run by stream-worker.js for all the tabs, or by a page itself where
// there is no SharedWorker. See nodes/ui/live.py for the wire format.
//
// It reads the stream with fetch rather than EventSource: it must know the
// answer's status (401: signed out; 503: wait as told), and it reopens the
// stream itself, with the topics of the moment and each log's resume cursor in
// the URL (an EventSource would reconnect to the URL it started with).
"use strict";

class LiveStream {
  // deliver(topic, html): a fragment of a topic; done(topic): a topic ended for good;
  // status(state): "live", "reconnecting" or "signed-out".
  constructor({ deliver, done, status }) {
    this.deliver = deliver;
    this.done = done;
    this.status = status;
    this.topics = new Map(); // topic -> resume cursor ("" from the start)
    this.attempt = 0;
    this.controller = null;
    this.timer = null;
  }

  // Ask for exactly these topics (keeping the cursors of those still asked).
  want(topics) {
    const next = new Map();
    for (const topic of topics) next.set(topic, this.topics.get(topic) || "");
    this.topics = next;
    this.reopen(30); // a few tabs that open at once share one new stream
  }

  reopen(delay) {
    clearTimeout(this.timer);
    if (this.controller) this.controller.abort();
    this.controller = null;
    if (this.topics.size === 0) return;
    this.timer = setTimeout(() => this.open(), delay);
  }

  url() {
    const query = new URLSearchParams();
    for (const [topic, cursor] of this.topics) {
      query.append("topic", cursor ? `${topic} ${cursor}` : topic);
    }
    return `/ui/stream?${query}`;
  }

  async open() {
    const controller = new AbortController();
    this.controller = controller;
    let retryAfter = null;
    try {
      const response = await fetch(this.url(), {
        signal: controller.signal, credentials: "same-origin",
        headers: { accept: "text/event-stream" },
      });
      if (response.status === 401) {
        this.status("signed-out");
        return; // reloading the page leads to sign-in
      }
      if (!response.ok) {
        retryAfter = Number(response.headers.get("retry-after")) || null;
        throw new Error(`status ${response.status}`);
      }
      this.status("live");
      this.attempt = 0;
      await this.read(response.body.getReader());
    } catch (error) {
      if (controller.signal.aborted) return; // reopened on purpose
    }
    if (this.controller !== controller) return;
    // Ended or failed: open again, sooner the first time (app-node's stream lagged).
    this.status("reconnecting");
    this.attempt += 1;
    const backoff = Math.min(250 * 2 ** this.attempt, 10000) * (0.8 + 0.4 * Math.random());
    this.reopen(retryAfter ? retryAfter * 1000 : backoff);
  }

  async read(reader) {
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      const blocks = buffer.split(/\r\n\r\n|\n\n|\r\r/);
      buffer = blocks.pop();
      for (const block of blocks) this.event(block);
    }
  }

  event(block) {
    let name = "", id = null;
    const data = [];
    for (const line of block.split(/\r\n|\n|\r/)) {
      if (line.startsWith(":")) continue; // a keep-alive
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "data") data.push(value);
      else if (field === "event") name = value;
      else if (field === "id") id = value;
    }
    if (data.length === 0) return;
    if (name === "done") {
      this.topics.delete(data[0]);
      this.done(data[0]);
      return;
    }
    const topic = data[0];
    if (!this.topics.has(topic)) return; // no longer asked for
    if (id !== null) this.topics.set(topic, id);
    this.deliver(topic, data.slice(1).join("\n"));
  }
}

// Loaded by importScripts in the worker, or by a page's <script>.
self.LiveStream = LiveStream;
