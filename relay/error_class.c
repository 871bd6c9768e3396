/*
 * error_class.c
 *		Whether an ERROR met while recording or storing messages can be a
 *		message's own. A flow that fails to record a batch records it again
 *		message by message and dead-letters the one that fails alone
 *		(record_each.c, flow_reverse.c); an ERROR that says nothing about
 *		the messages makes that useless, and holds the pipeline instead.
 */
#include "postgres.h"

#include "utils/elog.h"

#include "flow_errors.h"

/*
 * Whether an ERROR says nothing about the messages being recorded, so that
 * recording them one by one cannot help: a full disk or too many
 * connections, a lease no longer held, a cancel or shutdown, an I/O error,
 * a deadlock or serialization failure. Out of memory (53200) is not among
 * them: one huge message can cause it.
 */
bool
RelayErrorIsEnvironmental(int sqlerrcode)
{
	int			category = ERRCODE_TO_CATEGORY(sqlerrcode);

	if (sqlerrcode == ERRCODE_OUT_OF_MEMORY)
		return false;
	return category == ERRCODE_CONNECTION_EXCEPTION ||
		category == ERRCODE_TRANSACTION_ROLLBACK ||
		category == ERRCODE_INSUFFICIENT_RESOURCES ||
		category == ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE ||
		category == ERRCODE_OPERATOR_INTERVENTION ||
		category == ERRCODE_SYSTEM_ERROR ||
		category == ERRCODE_INVALID_TRANSACTION_STATE;
}
