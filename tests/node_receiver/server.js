// A service that already exists, written in Node.js, behind effectgate's declared HTTP effects.
// It verifies every request with the `standardwebhooks` npm package and acts once per Idempotency-Key:
// a key it has acted on gets the stored answer again, and is counted as seen but not acted.
//
//   PORT=3000 WEBHOOK_SECRET=whsec_... node server.js
//
// What it does with an order is steered by the order id, so tests can script a service's bad days:
//   ...flaky...  answers 500 the first time, then acts
//   ...reject... answers 422 (never acts)
//   ...hold...   acts, then holds its answer until POST /release (the test kills the worker meanwhile)
//   ...drop...   acts, then drops the connection without answering, the first time
// GET /stats answers {seen: {key: n}, acted: {key: n}, rejected_signatures: n, held: [key]}.
"use strict";

const http = require("http");
const { Webhook } = require("standardwebhooks");

const secret = process.env.WEBHOOK_SECRET;
if (!secret) {
  console.error("WEBHOOK_SECRET is not set");
  process.exit(2);
}
const webhook = new Webhook(secret);
const seen = {};
const acted = {};
const answers = {};
const failedOnce = new Set();
const held = [];
let rejectedSignatures = 0;

function send(res, status, body) {
  res.writeHead(status, { "Content-Type": "application/json" });
  res.end(JSON.stringify(body));
}

function handleEffect(req, res, raw) {
  let message;
  try {
    message = webhook.verify(raw, req.headers);
  } catch (err) {
    rejectedSignatures += 1;
    return send(res, 401, { error: "bad_signature" });
  }
  const key = req.headers["idempotency-key"];
  if (!key) return send(res, 400, { error: "no_idempotency_key" });
  seen[key] = (seen[key] || 0) + 1;
  if (answers[key]) return send(res, 200, answers[key]);
  const order = String(message.event.payload.data.object.metadata.order_id);
  if (order.includes("reject")) return send(res, 422, { error: "order_unknown", order });
  if (order.includes("flaky") && !failedOnce.has(key)) {
    failedOnce.add(key);
    return send(res, 500, { error: "database_busy" });
  }
  acted[key] = (acted[key] || 0) + 1;
  answers[key] = { order, fulfilled: true, effect: message.effect.key };
  if (order.includes("drop") && acted[key] === 1) {
    // Acted, and the answer lost on the way: the caller must retry with the same key.
    req.socket.destroy();
    return;
  }
  if (order.includes("hold") && acted[key] === 1) {
    // The action is done, the answer not yet given: a worker killed now never hears it.
    held.push({ key, res });
    return;
  }
  send(res, 200, answers[key]);
}

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (chunk) => chunks.push(chunk));
  req.on("end", () => {
    const raw = Buffer.concat(chunks).toString("utf8");
    if (req.method === "GET" && req.url === "/stats") {
      return send(res, 200, {
        seen,
        acted,
        rejected_signatures: rejectedSignatures,
        held: held.map((h) => h.key),
      });
    }
    if (req.method === "POST" && req.url === "/release") {
      for (const h of held.splice(0)) send(h.res, 200, answers[h.key]);
      return send(res, 200, { released: true });
    }
    if (req.method === "POST" && req.url.startsWith("/hooks/")) return handleEffect(req, res, raw);
    send(res, 404, { error: "not_found" });
  });
});

server.listen(Number(process.env.PORT || 3000), "127.0.0.1", () => {
  console.log(`node receiver listening on 127.0.0.1:${server.address().port}`);
});
