// The browser's one live stream, shared by all its tabs of the UI (one SharedWorker
// per signed-in user): six live tabs hold one connection, not six, so a seventh
// still loads over HTTP/1.1. Each tab says which topics it shows; the worker asks
// for their union and hands each fragment to the tabs that show its topic.
"use strict";
importScripts("/static/live-stream.js");

const tabs = new Map(); // tab id -> { port, topics: Set }
let state = "reconnecting";

function everyone(message) {
  for (const tab of tabs.values()) tab.port.postMessage(message);
}

const stream = new LiveStream({
  deliver(topic, html) {
    for (const tab of tabs.values()) {
      if (tab.topics.has(topic)) tab.port.postMessage({ topic, html });
    }
  },
  done(topic) {
    for (const tab of tabs.values()) tab.topics.delete(topic);
    everyone({ done: topic });
  },
  status(next) {
    state = next;
    everyone({ state });
  },
});

function wantUnion() {
  const union = new Set();
  for (const tab of tabs.values()) for (const topic of tab.topics) union.add(topic);
  stream.want(union);
}

function leave(id) {
  if (tabs.delete(id)) wantUnion();
}

self.onconnect = (event) => {
  const port = event.ports[0];
  port.onmessage = ({ data }) => {
    if (data.hello) {
      tabs.set(data.hello, { port, topics: new Set(data.topics) });
      port.postMessage({ state });
      // Every join opens the stream again: each topic starts with a snapshot, so the
      // new tab misses nothing that changed since its page was rendered.
      wantUnion();
      // The tab holds a lock named by its id until it is gone (closed, crashed,
      // navigated away): getting it is how the worker learns the tab left.
      if (self.navigator.locks) {
        self.navigator.locks.request(data.hello, () => leave(data.hello));
      }
    } else if (data.bye) {
      leave(data.bye);
    }
  };
  port.start();
};
