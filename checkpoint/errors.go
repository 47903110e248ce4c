package checkpoint

import "errors"

var (
	// ErrFingerprintMismatch is returned (wrapped, with the operators that
	// differ named in the message) when the running job's Fingerprint does not
	// match the one stored with the latest completed checkpoint or savepoint.
	ErrFingerprintMismatch = errors.New("checkpoint: job fingerprint does not match the checkpoint")
	// ErrFormatTooNew is returned by Open and RestoreSavepoint for data written
	// by a newer runnel (a FormatVersion above FormatVersion).
	ErrFormatTooNew = errors.New("checkpoint: format version is newer than this build supports")
	// ErrClosed is returned by calls on a closed Store.
	ErrClosed = errors.New("checkpoint: store closed")
	// ErrStaleID is returned by Commit for an ID not above the latest
	// completed checkpoint's.
	ErrStaleID = errors.New("checkpoint: checkpoint id does not increase")
	// ErrNotNext is returned by ApplyBatch for a batch that does not follow
	// the store's latest checkpoint (one in between is missing).
	ErrNotNext = errors.New("checkpoint: batch does not follow the latest checkpoint")
	// ErrNotEmpty is returned by RestoreSavepoint when the target directory
	// already holds a completed checkpoint.
	ErrNotEmpty = errors.New("checkpoint: store already holds checkpoints")
	// ErrIncompleteRestore is returned by Open when a savepoint restore into
	// the directory was interrupted; run the restore again.
	ErrIncompleteRestore = errors.New("checkpoint: an interrupted savepoint restore left this store incomplete")
	// ErrFailed is returned once a commit hit a fatal storage error (a failed
	// write or fsync of the log): the store is poisoned, every later Commit
	// fails, and the job must restart and recover from the last completed
	// checkpoint. Whether the failed checkpoint itself became durable is
	// unknown until then.
	ErrFailed = errors.New("checkpoint: store failed")
	// ErrCorrupt is returned for malformed stored records and savepoint files.
	ErrCorrupt = errors.New("checkpoint: corrupt data")
	// ErrInvalid is returned for invalid arguments (empty UIDs, oversized keys).
	ErrInvalid = errors.New("checkpoint: invalid argument")
)
