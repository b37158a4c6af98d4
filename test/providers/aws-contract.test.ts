/**
 * The provider contract (contract.ts) for the aws provider, against the
 * EC2/SSM emulator through the real SDK clients.
 */
import { providerContract } from "./contract.js";
import { awsWorld, machine } from "../helpers/aws.js";

providerContract("aws (emulator)", async () => {
  const w = await awsWorld();
  return {
    provider: w.provider,
    machine: (id) => machine(id),
    userOf: (m) => m.id,
    gone: async () => w.emu.live().length === 0,
    close: () => w.close(),
  };
});
