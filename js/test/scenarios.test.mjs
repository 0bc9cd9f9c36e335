// The shared scenarios (tests/scenarios/*.json) through the Node host.
import { test } from 'node:test';

import { loadScenario, runScenario, scenarioFiles } from '../support/scenario-runner.mjs';

const files = scenarioFiles();
test('the scenario directory is not empty', (t) => {
  if (files.length < 20) throw new Error(`only ${files.length} scenario files found`);
});
for (const file of files) {
  // Parsing happens here, at collection: a bad file fails the suite.
  const scenario = loadScenario(file);
  const skip = scenario.hosts.includes('node') ? false : `not for the Node host: ${scenario.only_because}`;
  test(`scenario ${scenario.name}`, { skip, timeout: 60_000 }, () => runScenario(scenario));
}
