// openai-check.mjs: the official `openai` npm client against ./run -m serve,
// unchanged: models, a chat completion, a streamed one, a completion, and a
// refused request read as an APIError. Exits 1 on the first mismatch.
//   (cd tools/clients && npm ci)   the client pinned in package.json
//   ./run MODEL -m serve --port 8080 &
//   node tools/clients/openai-check.mjs http://127.0.0.1:8080/v1
// tests/test_serve.c runs it when the client is installed here.
import OpenAI from "openai";

const baseURL = process.argv[2] ?? "http://127.0.0.1:8080/v1";
// no retries and a bound on each request: a test must fail, never wait
const client = new OpenAI({ baseURL, apiKey: "none", maxRetries: 0, timeout: 60000 });
const fail = (what) => { console.error(`openai-check: ${what}`); process.exit(1); };

const models = await client.models.list();
const model = models.data[0]?.id ?? fail("no model listed");
console.log(`models: ${models.data.map((m) => m.id).join(", ")}`);

const messages = [{ role: "system", content: "Be brief." }, { role: "user", content: "Who made the light?" }];
const chat = await client.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0, seed: 1 });
const text = chat.choices[0].message.content;
console.log(`chat: ${JSON.stringify(text)} (${chat.choices[0].finish_reason}; usage ${JSON.stringify(chat.usage)})`);
if (!chat.usage || chat.usage.completion_tokens !== 24) fail("chat usage");

const stream = await client.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0, stream: true });
let streamed = "", finish = null;
for await (const chunk of stream) {
  streamed += chunk.choices[0]?.delta?.content ?? "";
  finish = chunk.choices[0]?.finish_reason ?? finish;
}
console.log(`stream: ${JSON.stringify(streamed)} (${finish})`);
if (streamed !== text) fail("the stream's text is not the plain response's");

const comp = await client.completions.create({ model, prompt: "In the beginning", max_tokens: 16, temperature: 0 });
console.log(`completion: ${JSON.stringify(comp.choices[0].text)}`);

try {
  await client.chat.completions.create({ model, messages, max_tokens: 4, temperature: "hot" });
  fail("a bad temperature was accepted");
} catch (e) {
  if (!(e instanceof OpenAI.APIError) || e.status !== 400) throw e;
  console.log(`refused: ${e.status} ${e.message}`);
}
console.log("openai-check: ok");
