/**
 * The SSM JSON 1.1 actions of the emulator. SendCommand queues one
 * invocation per instance; it runs when the instance's agent is online
 * (after any injected delay or hold), or ends DeliveryTimedOut after
 * TimeoutSeconds. A duplicated delivery runs the same script a second time.
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
      const commands = ((b.Parameters as Record<string, string[]> | undefined)?.commands ?? []).join("\n");
      const commandId = randomUUID();
      const inv: Invocation & { instanceId: string; gated?: boolean } = { commandId, comment: String(b.Comment ?? ""), script: commands, status: "Pending", code: -1, stdout: "", stderr: "", requestedAt: Date.now(), instanceId: inst.id };
      emu.invocations.set(commandId, inv);
      const delay = emu.faults.ssmDelays.shift() ?? 0;
      const hold = emu.faults.ssmHolds.shift();
      const dup = emu.faults.ssmDuplicates.shift();
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
      emu.later(delay, deliver);
      const timeoutS = Number(b.TimeoutSeconds ?? 3600);
      if (!hold) {
        emu.later(delay + timeoutS * 1000, () => {
          if (inv.status === "Pending") inv.status = "DeliveryTimedOut";
        });
      }
      return { status: 200, body: { Command: { CommandId: commandId, Comment: inv.comment, DocumentName: b.DocumentName, InstanceIds: ids, Status: "Pending", RequestedDateTime: inv.requestedAt / 1000 } } };
    }
    case "GetCommandInvocation": {
      const inv = emu.invocations.get(String(b.CommandId));
      if (!inv || inv.instanceId !== b.InstanceId) return err("InvocationDoesNotExist", "the command invocation does not exist");
      return {
        status: 200,
        body: {
          CommandId: inv.commandId,
          InstanceId: inv.instanceId,
          Comment: inv.comment,
          DocumentName: "AWS-RunShellScript",
          Status: inv.status,
          StatusDetails: inv.status,
          ResponseCode: inv.code,
          StandardOutputContent: inv.stdout.slice(0, 24_000),
          StandardErrorContent: inv.stderr.slice(0, 8_000),
        },
      };
    }
    case "ListCommands": {
      const all = [...emu.invocations.values()].filter((i) => !b.InstanceId || i.instanceId === b.InstanceId).sort((x, y) => y.requestedAt - x.requestedAt);
      const start = b.NextToken ? Number(b.NextToken) : 0;
      const max = Number(b.MaxResults ?? 50);
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
      return { status: 200, body: { InstanceInformationList: list } };
    }
    default:
      return err("UnknownOperationException", `the emulator does not implement ${action}`);
  }
}
