/**
 * The SSM JSON 1.1 actions of the emulator. SendCommand queues one
 * invocation per instance; it runs when the instance's agent is online
 * (after any injected delay, hold or `Delayed` spell), or ends `TimedOut`
 * (StatusDetails DeliveryTimedOut) after TimeoutSeconds; a run longer than
 * its executionTimeout is killed and ends `TimedOut` (ExecutionTimedOut).
 * A duplicated delivery runs the same script a second time. Right after
 * SendCommand, GetCommandInvocation may answer InvocationDoesNotExist
 * (`invocationLagMs`). List calls answer in pages (`pageSize`).
 */
import { randomUUID } from "node:crypto";
import type { AwsEmulator } from "./emulator.js";
import type { Invocation } from "./instance.js";

type Reply = { status: number; body: unknown; errorType?: string };

function err(type: string, message: string): Reply {
  return { status: 400, body: { __type: type, message }, errorType: type };
}

export async function ssmAction(emu: AwsEmulator, action: string, b: Record<string, unknown>, region: string): Promise<Reply> {
  switch (action) {
    case "SendCommand": {
      if (b.DocumentName !== "AWS-RunShellScript") return err("InvalidDocument", `document ${String(b.DocumentName)} is not supported by the emulator`);
      const ids = (b.InstanceIds as string[] | undefined) ?? [];
      const inst = emu.instances.get(ids[0] ?? "");
      if (ids.length !== 1 || !inst || inst.region !== region || inst.state === "terminated") return err("InvalidInstanceId", "the instance is not a managed instance");
      const params = (b.Parameters as Record<string, string[]> | undefined) ?? {};
      const commands = (params.commands ?? []).join("\n");
      const commandId = randomUUID();
      const executionTimeoutS = Number(params.executionTimeout?.[0] ?? 3600);
      const inv: Invocation & { instanceId: string; gated?: boolean } = { commandId, comment: String(b.Comment ?? ""), script: commands, status: "Pending", code: -1, stdout: "", stderr: "", requestedAt: Date.now(), instanceId: inst.id, executionTimeoutS };
      emu.invocations.set(commandId, inv);
      const delay = emu.faults.ssmDelays.shift() ?? 0;
      const hold = emu.faults.ssmHolds.shift();
      const dup = emu.faults.ssmDuplicates.shift();
      const delayed = emu.faults.ssmDelayed.shift();
      const slow = emu.faults.ssmSlowRuns.shift() ?? emu.faults.ssmSlowSteps[inv.comment.split(" ").at(-1) ?? ""];
      if (slow !== undefined) inv.script = `sleep ${slow / 1000}\n${inv.script}`;
      inv.gated = true;
      const deliver = async () => {
        if (hold) await hold.held;
        inv.gated = false;
        if (inv.status !== "Pending") return;
        if (!inst.ssmOnline) return; // delivered when the agent comes back (deliverPending), or times out
        await emu.execute(inv, inst);
        if (dup !== undefined) {
          emu.later(dup, async () => {
            if (inst.ssmOnline) await inst.run(inv.script);
          });
        }
      };
      emu.later(delay, () => {
        if (delayed === undefined) return deliver();
        // The service tried to reach the agent and could not; it retries, and the invocation says so.
        if (inv.status === "Pending") inv.status = "Delayed";
        emu.later(delayed, () => {
          if (inv.status !== "Delayed") return;
          inv.status = "Pending";
          return deliver();
        });
      });
      const timeoutS = Number(b.TimeoutSeconds ?? 3600);
      if (!hold) {
        emu.later(delay + (emu.faults.deliveryTimeoutMs || timeoutS * 1000), () => {
          if (inv.status === "Pending" || inv.status === "Delayed") [inv.status, inv.details] = ["TimedOut", "DeliveryTimedOut"];
        });
      }
      return { status: 200, body: { Command: { CommandId: commandId, Comment: inv.comment, DocumentName: b.DocumentName, InstanceIds: ids, Status: "Pending", RequestedDateTime: inv.requestedAt / 1000 } } };
    }
    case "GetCommandInvocation": {
      const inv = emu.invocations.get(String(b.CommandId));
      if (!inv || inv.instanceId !== b.InstanceId || Date.now() < inv.requestedAt + emu.faults.invocationLagMs) return err("InvocationDoesNotExist", "the command invocation does not exist");
      return {
        status: 200,
        body: {
          CommandId: inv.commandId,
          InstanceId: inv.instanceId,
          Comment: inv.comment,
          DocumentName: "AWS-RunShellScript",
          Status: inv.status,
          StatusDetails: inv.details ?? inv.status,
          ResponseCode: inv.code,
          StandardOutputContent: inv.stdout.slice(0, 24_000),
          StandardErrorContent: inv.stderr.slice(0, 8_000),
        },
      };
    }
    case "ListCommands": {
      const all = [...emu.invocations.values()].filter((i) => !b.InstanceId || i.instanceId === b.InstanceId).sort((x, y) => y.requestedAt - x.requestedAt);
      const start = b.NextToken ? Number(b.NextToken) : 0;
      const max = Math.min(Number(b.MaxResults ?? 50), emu.faults.pageSize);
      const page = all.slice(start, start + max);
      const next = start + max < all.length ? String(start + max) : undefined;
      return {
        status: 200,
        body: { Commands: page.map((i) => ({ CommandId: i.commandId, Comment: i.comment, DocumentName: "AWS-RunShellScript", InstanceIds: [i.instanceId], Status: i.status, RequestedDateTime: i.requestedAt / 1000 })), NextToken: next },
      };
    }
    case "DescribeInstanceInformation": {
      const filters = (b.Filters as Array<{ Key: string; Values: string[] }> | undefined) ?? [];
      const want = filters.find((f) => f.Key === "InstanceIds")?.Values;
      const list = [...emu.instances.values()]
        .filter((i) => i.region === region && i.state === "running" && (!want || want.includes(i.id)))
        .map((i) => ({ InstanceId: i.id, PingStatus: i.ssmOnline ? "Online" : "ConnectionLost", PlatformType: "Linux", AgentVersion: "3.3.0.0-emulated" }));
      // MaxResults 5..50 (default 10 here), capped by the page size; NextToken is the offset.
      const start = b.NextToken ? Number(b.NextToken) : 0;
      const max = Math.min(Number(b.MaxResults ?? 10), emu.faults.pageSize);
      const next = start + max < list.length ? String(start + max) : undefined;
      return { status: 200, body: { InstanceInformationList: list.slice(start, start + max), NextToken: next } };
    }
    case "CancelCommand": {
      const ids = (b.InstanceIds as string[] | undefined) ?? [];
      const hits = [...emu.invocations.values()].filter((i) => i.commandId === b.CommandId && (ids.length === 0 || ids.includes(i.instanceId)));
      if (hits.length === 0) return err("InvalidCommandId", "the command id is not valid");
      for (const inv of hits) emu.cancel(inv);
      return { status: 200, body: {} };
    }
    default:
      return err("UnknownOperationException", `the emulator does not implement ${action}`);
  }
}
