package protocol

// MessageSysFlag bits (protocol §4.7): the int32 sysFlag of send request
// headers and of stored records.
const (
	// SysFlagCompressed marks a compressed body (COMPRESSED_FLAG).
	SysFlagCompressed int32 = 0x1
	// SysFlagMultiTags marks a MULTI_TAG topic (set by the broker).
	SysFlagMultiTags int32 = 0x2
	// SysFlagTransactionNotType is the transaction type of a plain message.
	SysFlagTransactionNotType int32 = 0x0
	// SysFlagTransactionPrepared marks a transactional half message.
	SysFlagTransactionPrepared int32 = 0x4
	// SysFlagTransactionCommit marks a committed transactional message.
	SysFlagTransactionCommit int32 = 0x8
	// SysFlagTransactionRollback marks a rolled back transactional message.
	// It is also the mask of the transaction type bits (SysFlagTransactionMask).
	SysFlagTransactionRollback int32 = 0xC
	// SysFlagTransactionMask selects the transaction type bits 2-3.
	SysFlagTransactionMask int32 = 0xC
	// SysFlagBornHostV6 marks an IPv6 born host in a stored record.
	SysFlagBornHostV6 int32 = 0x10
	// SysFlagStoreHostV6 marks an IPv6 store host in a stored record.
	SysFlagStoreHostV6 int32 = 0x20
	// SysFlagNeedUnwrap marks an inner-batch record that must be unwrapped.
	SysFlagNeedUnwrap int32 = 0x40
	// SysFlagInnerBatch marks an inner-batch record.
	SysFlagInnerBatch int32 = 0x80

	// SysFlagCompressionMask selects the compression type bits 8-10.
	SysFlagCompressionMask int32 = 0x700
	// SysFlagCompressionLZ4 is compression type 1 (LZ4; not supported here).
	SysFlagCompressionLZ4 int32 = 0x100
	// SysFlagCompressionZSTD is compression type 2 (ZSTD; not supported here).
	SysFlagCompressionZSTD int32 = 0x200
	// SysFlagCompressionZlib is compression type 3 (zlib). Type 0 also means
	// zlib for backward compatibility (the Go client sets only
	// SysFlagCompressed).
	SysFlagCompressionZlib int32 = 0x300
)

// TransactionType returns the transaction type bits of a MessageSysFlag:
// SysFlagTransactionNotType, SysFlagTransactionPrepared,
// SysFlagTransactionCommit or SysFlagTransactionRollback.
func TransactionType(sysFlag int32) int32 { return sysFlag & SysFlagTransactionMask }

// SetTransactionType returns sysFlag with its transaction type bits replaced
// by typ (one of the SysFlagTransaction* values).
func SetTransactionType(sysFlag, typ int32) int32 {
	return sysFlag&^SysFlagTransactionMask | typ&SysFlagTransactionMask
}

// PullSysFlag bits (PULL_MESSAGE request header sysFlag, protocol §4.7).
const (
	// PullFlagCommitOffset asks the broker to store the request's commitOffset.
	PullFlagCommitOffset int32 = 0x1
	// PullFlagSuspend allows long polling for suspendTimeoutMillis.
	PullFlagSuspend int32 = 0x2
	// PullFlagSubscription says the request carries its own subscription.
	PullFlagSubscription int32 = 0x4
	// PullFlagClassFilter is the legacy class-filter mode.
	PullFlagClassFilter int32 = 0x8
	// PullFlagLitePull marks a Java lite pull (code 361).
	PullFlagLitePull int32 = 0x10
)

// TopicSysFlag bits (protocol §4.7).
const (
	// TopicFlagUnit marks a unit topic.
	TopicFlagUnit int32 = 0x1
	// TopicFlagUnitSub marks a unit-subscription topic.
	TopicFlagUnitSub int32 = 0x2
)

// Permission bits of topics, queues and brokers (Java PermName).
const (
	// PermPriority is the priority permission bit.
	PermPriority int32 = 0x8
	// PermRead allows reading (consuming).
	PermRead int32 = 0x4
	// PermWrite allows writing (producing).
	PermWrite int32 = 0x2
	// PermInherit lets new topics be auto-created from this one (TBW102).
	PermInherit int32 = 0x1
)

// PermReadable reports whether perm includes PermRead.
func PermReadable(perm int32) bool { return perm&PermRead != 0 }

// PermWritable reports whether perm includes PermWrite.
func PermWritable(perm int32) bool { return perm&PermWrite != 0 }

// PermInheritable reports whether perm includes PermInherit.
func PermInheritable(perm int32) bool { return perm&PermInherit != 0 }

// PermValid reports whether perm is a valid topic permission: 0..7, as the
// Java broker requires (perm < 8).
func PermValid(perm int32) bool { return perm >= 0 && perm < 8 }
