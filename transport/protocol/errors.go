package protocol

import (
	"errors"
	"strconv"
	"strings"
)

// Error is a RocketMQ response code other than success, with the remark the
// responder gave. errors.Is matches two *Error values by Code alone, so
//
//	errors.Is(err, protocol.ErrTopicNotExist)
//
// holds for any TOPIC_NOT_EXIST reply, whatever its remark. Error values are
// immutable and safe to share.
type Error struct {
	Code   int32
	Remark string
}

// Error returns "rocketmq: CODE 17 TOPIC_NOT_EXIST: remark" (the name left
// out for a code runnel does not know, the remark when empty).
func (e *Error) Error() string {
	s := "rocketmq: CODE " + strconv.Itoa(int(e.Code))
	if name := ResponseCodeName(e.Code); name != "" {
		s += " " + name
	}
	if e.Remark != "" {
		s += ": " + e.Remark
	}
	return s
}

// Is reports whether target is an *Error with the same Code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// Sentinels for the response codes callers branch on; match them with
// errors.Is. Do not modify them.
var (
	ErrSystemError               = &Error{Code: ResSystemError}
	ErrSystemBusy                = &Error{Code: ResSystemBusy}
	ErrRequestCodeNotSupported   = &Error{Code: ResRequestCodeNotSupported}
	ErrTransactionFailed         = &Error{Code: ResTransactionFailed}
	ErrFlushDiskTimeout          = &Error{Code: ResFlushDiskTimeout}
	ErrSlaveNotAvailable         = &Error{Code: ResSlaveNotAvailable}
	ErrFlushSlaveTimeout         = &Error{Code: ResFlushSlaveTimeout}
	ErrMessageIllegal            = &Error{Code: ResMessageIllegal}
	ErrServiceNotAvailable       = &Error{Code: ResServiceNotAvailable}
	ErrVersionNotSupported       = &Error{Code: ResVersionNotSupported}
	ErrNoPermission              = &Error{Code: ResNoPermission}
	ErrTopicNotExist             = &Error{Code: ResTopicNotExist}
	ErrTopicExistAlready         = &Error{Code: ResTopicExistAlready}
	ErrPullNotFound              = &Error{Code: ResPullNotFound}
	ErrPullRetryImmediately      = &Error{Code: ResPullRetryImmediately}
	ErrPullOffsetMoved           = &Error{Code: ResPullOffsetMoved}
	ErrQueryNotFound             = &Error{Code: ResQueryNotFound}
	ErrSubscriptionParseFailed   = &Error{Code: ResSubscriptionParseFailed}
	ErrSubscriptionNotExist      = &Error{Code: ResSubscriptionNotExist}
	ErrSubscriptionNotLatest     = &Error{Code: ResSubscriptionNotLatest}
	ErrSubscriptionGroupNotExist = &Error{Code: ResSubscriptionGroupNotExist}
	ErrInvalidParameter          = &Error{Code: ResInvalidParameter}
	ErrNoMessage                 = &Error{Code: ResNoMessage}
	ErrPollingFull               = &Error{Code: ResPollingFull}
	ErrPollingTimeout            = &Error{Code: ResPollingTimeout}
	ErrIllegalOperation          = &Error{Code: ResIllegalOperation}
	ErrGoAway                    = &Error{Code: ResGoAway}
)

// ResponseError returns nil when c's code is ResSuccess, and otherwise an
// *Error holding c's code and a copy of its remark (the copy does not alias
// the frame buffer, so the error may outlive it).
//
// Codes that mean "stored, with a caveat" for sends (10, 11, 12) are errors
// here too; the send path, which knows better, checks for them first.
func ResponseError(c *Command) error {
	if c.Code == ResSuccess {
		return nil
	}
	return &Error{Code: c.Code, Remark: strings.Clone(c.Remark)}
}

// IsRetryable reports whether err is a broker reply that the same request
// may succeed on when retried, on another queue or broker, after the
// failure: the codes on which rocketmq-client-go's producer retries a send
// (TOPIC_NOT_EXIST 17, SERVICE_NOT_AVAILABLE 14, SYSTEM_ERROR 1, NO_PERMISSION
// 16; protocol reference §3.3), plus SYSTEM_BUSY 2 (flow control, which Java
// clients retry after backing off) and GO_AWAY 1500 (the server is shutting
// down). MESSAGE_ILLEGAL, INVALID_PARAMETER and other codes describing the
// request itself are not retryable.
//
// For a send, a retryable code still means the message was not stored.
func IsRetryable(err error) bool {
	var e *Error
	if !errors.As(err, &e) {
		return false
	}
	switch e.Code {
	case ResTopicNotExist, ResServiceNotAvailable, ResSystemError, ResNoPermission, ResSystemBusy, ResGoAway:
		return true
	}
	return false
}
