/**
 * The durable record of every EC2 launch berth asks for (table
 * `aws_launches`, src/store/aws-launches.ts), kept with the machine in the coordinator's store.
 *
 * A row is written BEFORE RunInstances is sent (its ClientToken, region,
 * deployment and machine), and completed with the instance id and account
 * as soon as RunInstances answers, or as soon as a retry finds the
 * instance again by its ClientToken when the answer was lost. Destroy and
 * the sweep work from these rows, so an instance is found again in the
 * region and under the deployment it was launched with, whatever the
 * configuration says today. A row is closed (`ended_at`) only once its
 * instance is observed terminated, or its ClientToken is observed to have
 * launched nothing.
 */
export type { LaunchRecord, LaunchRecords } from "../../store/aws-launches.js";
export { storeLaunchRecords } from "../../store/aws-launches.js";
