// Google's Node client (@google-cloud/tasks, REST fallback) against TaskForge, with the
// setup of API-cloudtasks.md "Serving and clients".  Prints one JSON line of what it saw.
const {CloudTasksClient} = require("@google-cloud/tasks");
const {OAuth2Client} = require("google-auth-library");

async function main() {
  const [host, port, key, targetUrl] = process.argv.slice(2);
  const authClient = new OAuth2Client();
  authClient.setCredentials({access_token: key});
  const client = new CloudTasksClient({
    fallback: true, apiEndpoint: host, port: Number(port), protocol: "http", authClient,
  });
  const parent = "projects/node-project/locations/europe-west1";
  const name = `${parent}/queues/from-node`;
  const seen = {};
  const [queue] = await client.createQueue({
    parent, queue: {name, rateLimits: {maxDispatchesPerSecond: 2.5}},
  });
  seen.queue = {name: queue.name, rate: queue.rateLimits.maxDispatchesPerSecond,
                burst: queue.rateLimits.maxBurstSize};
  try {
    await client.createQueue({parent, queue: {name}});
    seen.conflict = "none";
  } catch (err) {
    seen.conflict = err.status || err.code;
  }
  await client.pauseQueue({name});
  const [task] = await client.createTask({
    parent: name,
    task: {
      name: `${name}/tasks/node-1`,
      httpRequest: {httpMethod: "PATCH", url: targetUrl, body: Buffer.from("from node"),
                    headers: {"Content-Type": "text/plain"}},
    },
    responseView: "FULL",
  });
  seen.task = {name: task.name, method: task.httpRequest.httpMethod,
               body: Buffer.from(task.httpRequest.body).toString()};
  const [tasks] = await client.listTasks({parent: name});
  seen.listed = tasks.map((t) => t.name);
  await client.deleteTask({name: `${name}/tasks/node-1`});
  try {
    await client.getTask({name: `${name}/tasks/node-1`});
    seen.deleted = "still there";
  } catch (err) {
    seen.deleted = err.status || err.code;
  }
  await client.deleteQueue({name});
  console.log(JSON.stringify(seen));
}

main().catch((err) => { console.error(err); process.exit(1); });
